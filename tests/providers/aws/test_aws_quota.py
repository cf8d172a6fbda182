"""Quota before a launch on AWS (moto): with a zero G-instance quota in the region first in price
order, `run` reads it before any create, skips that region naming the quota code and the request
command, and launches in the next region; no instance, group or key was ever created in the
zero-quota region. A quota that cannot be read (moto knows no EC2 quotas by default) is a note,
never a refusal."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpucloud.providers.aws.quota import verdicts
from tests.support.aws_runs import run_id_in
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.cli import cli
from tests.support.moto_server import Moto, moto, moto_server, tagged_alive  # noqa: F401

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]
G_ON_DEMAND = "L-DB2E81BA"


@contextmanager
def ec2_quotas(values: dict[tuple[str, str], float]) -> Iterator[None]:
    """moto's Service Quotas answering these EC2 quotas ((region, code) -> vCPUs); others stay
    unknown to it (NoSuchResourceException), as moto has them."""
    from moto.servicequotas.models import ServiceQuotasBackend

    original = ServiceQuotasBackend.get_service_quota

    def get(self: Any, service_code: str, quota_code: str) -> dict[str, Any]:
        value = values.get((self.region_name, quota_code)) if service_code == "ec2" else None
        if value is None:
            return original(self, service_code, quota_code)  # type: ignore[no-any-return]
        return {"ServiceCode": "ec2", "QuotaCode": quota_code, "QuotaName": quota_code, "Value": value}

    ServiceQuotasBackend.get_service_quota = get  # type: ignore[method-assign]
    try:
        yield
    finally:
        ServiceQuotasBackend.get_service_quota = original  # type: ignore[method-assign]


def test_lookups_that_fail_are_notes_and_a_low_quota_does_not_fit(moto: Moto) -> None:  # noqa: F811
    asks = [
        {"region": "us-east-1", "instance_type": "g4dn.xlarge", "spot": False, "vcpus": 4},
        {"region": "us-east-2", "instance_type": "p3.2xlarge", "spot": False, "vcpus": 8},
    ]
    with ec2_quotas({("us-east-1", G_ON_DEMAND): 0.0}):
        found = verdicts(asks)
    assert found[0]["fits"] is False and found[0]["code"] == G_ON_DEMAND and found[0]["limit"] == 0
    assert "request-service-quota-increase" in found[0]["fix"] and "--region us-east-1" in found[0]["fix"]
    assert found[1]["fits"] is None and "did not answer" in found[1]["note"]  # moto: NoSuchResource


def test_run_skips_a_zero_quota_region_before_any_create(
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    gpucloud_home: Path,
    tmp_path: Path,
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: quota-first\nresources:\n  cloud: aws\n  regions: [us-east-1, us-east-2]\n  gpu: T4:1\n"
        "run: echo quota-ok\nmax_duration: 10m\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GPUCLOUD_AZURE"))}
    env.update(moto.env)
    env.update({"GPUCLOUD_HOME": str(gpucloud_home), "CI": "true", "PYTHONPATH": str(REPO)})
    with ec2_quotas({("us-east-1", G_ON_DEMAND): 0.0, ("us-east-2", G_ON_DEMAND): 64.0}):
        out = subprocess.run(
            [sys.executable, "-m", "tests.support.aws_cli", "run", str(job), "--yes"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
    text = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 0, text[-3000:]
    assert "quota-ok" in text
    assert "skipping aws/us-east-1/g4dn.xlarge before launch" in text, text[-3000:]
    assert G_ON_DEMAND in text and "request-service-quota-increase" in text
    assert "attempt 1: aws/us-east-2/" in text, text[-3000:]
    assert "skipped before launch: aws/us-east-1/g4dn.xlarge: quota" in text, text[-2000:]  # the summary
    east1 = moto.client("ec2", "us-east-1")
    # This run's own (the worker's moto server also holds earlier tests' terminated instances).
    tagged = [{"Name": "tag:gpucloud-run", "Values": [run_id_in(out.stdout + out.stderr)]}]
    assert east1.describe_instances(Filters=tagged)["Reservations"] == []  # terminated ones count too
    assert east1.describe_key_pairs(Filters=tagged)["KeyPairs"] == []
    assert tagged_alive(moto) == []


def test_plan_json_shows_each_candidates_quota_with_credentials(
    moto: Moto,  # noqa: F811
    gpucloud_home: Path,
    tmp_path: Path,
) -> None:
    import json

    job = tmp_path / "job.yaml"
    job.write_text("name: q\nresources:\n  cloud: aws\n  regions: [us-east-1, us-east-2]\n  gpu: T4:1\nrun: echo\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GPUCLOUD_AZURE"))}
    env.update({"GPUCLOUD_HOME": str(gpucloud_home), "PYTHONPATH": str(REPO)})
    bare = cli("plan", str(job), "--json", env=env, timeout=120)
    assert bare.returncode == 0 and "quota" not in json.loads(bare.stdout)  # no credentials: nothing asked
    with ec2_quotas({("us-east-1", G_ON_DEMAND): 0.0, ("us-east-2", G_ON_DEMAND): 64.0}):
        out = cli("plan", str(job), "--json", env={**env, **moto.env}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    quota = {(q["region"], q["instance_type"]): q for q in json.loads(out.stdout)["quota"]}
    assert quota[("us-east-1", "g4dn.xlarge")]["fits"] is False
    assert quota[("us-east-1", "g4dn.xlarge")]["code"] == G_ON_DEMAND
    assert quota[("us-east-2", "g4dn.xlarge")]["fits"] is True
