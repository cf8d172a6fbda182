"""`catalog refresh` under IAM enforcement with only the policy `gpucloud iam-policy aws` prints: it
fetches; with the refresh's permissions taken out it fails naming the refused action and the policy
command, not "credentials or endpoint"."""

from __future__ import annotations

import copy
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpucloud.providers.aws.policy import policy_document
from tests.support.cli import cli
from tests.support.fake_prices import FakeAwsPricing, aws_product
from tests.support.moto_iam import enforced, iam_user
from tests.support.moto_server import Moto, moto, moto_server  # noqa: F401

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]
REFRESH_ACTIONS = {"ec2:DescribeInstanceTypes", "ec2:DescribeSpotPriceHistory", "pricing:GetProducts"}


@pytest.fixture
def pricing() -> Iterator[FakeAwsPricing]:
    fake = FakeAwsPricing(products=[aws_product("g4dn.xlarge", "us-east-1", 0.526)]).start()
    yield fake
    fake.stop()


def refresh(
    moto: Moto, pricing: FakeAwsPricing, home: Path, policy: dict[str, Any]
) -> subprocess.CompletedProcess[str]:  # noqa: F811
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GPUCLOUD_AZURE"))}
    env.update(moto.env)
    env.update(iam_user(moto, "gpucloud-catalog", policy))
    env.update({"GPUCLOUD_HOME": str(home), "CI": "true", "GPUCLOUD_AWS_PRICING_URL": pricing.url})
    env["PYTHONPATH"] = str(REPO)
    return cli("catalog", "refresh", "--cloud", "aws", "--region", "us-east-1", env=env, timeout=180)


def test_printed_policy_covers_catalog_refresh(
    moto: Moto,  # noqa: F811
    pricing: FakeAwsPricing,
    gpucloud_home: Path,
) -> None:
    doc = policy_document()
    granted = {a for s in doc["Statement"] for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert REFRESH_ACTIONS <= granted
    with enforced(moto):
        out = refresh(moto, pricing, gpucloud_home, doc)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "not authorized" not in text and "AccessDenied" not in text, text[-3000:]


def test_refresh_without_its_permissions_names_the_action_and_the_policy(
    moto: Moto,  # noqa: F811
    pricing: FakeAwsPricing,
    gpucloud_home: Path,
) -> None:
    doc = copy.deepcopy(policy_document())
    doc["Statement"] = [s for s in doc["Statement"] if s.get("Sid") != "CatalogRefresh"]
    for statement in doc["Statement"]:  # a launch may need one of them too (EFA counts): none left anywhere
        actions = [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]
        statement["Action"] = [a for a in actions if a not in REFRESH_ACTIONS]
    doc["Statement"] = [s for s in doc["Statement"] if s["Action"]]
    with enforced(moto):
        out = refresh(moto, pricing, gpucloud_home, doc)
    text = " ".join((out.stdout + out.stderr).split())
    assert out.returncode != 0 and out.returncode != 70, text[-3000:]
    assert "ec2:DescribeInstanceTypes" in text and "gpucloud iam-policy aws" in text, text[-3000:]
    assert "Traceback" not in text
