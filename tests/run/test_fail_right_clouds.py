"""Failing right across clouds: a `cloud: any` run whose first cloud has no credentials skips it once
(one line saying why and how to fix it) and goes on with the other cloud's candidates, to the end.
AWS missing -> Azure (fake ARM + Azurite + VM simulator); Azure missing -> AWS (moto + simulator).
Plus `gpucloud check` against each fake: whose credentials, which regions."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.aws_faults import SESSION_RECORD
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.azure_fixtures import (  # noqa: F401  (fixtures)
    arm,
    azure_env,
    azurite,
    fake_arm_server,
    leftovers,
)
from tests.support.azure_sim import AzureVmSimulator, azure_sim  # noqa: F401
from tests.support.cli import cli
from tests.support.fake_arm import FAKE_LOCATIONS, FakeArm
from tests.support.moto_server import Moto, moto, moto_server, tagged_alive  # noqa: F401
from tests.support.text import messages

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


AWS_CLI = "tests.support.aws_cli"  # the real CLI plus moto's missing placement groups (test hooks)


def any_cloud_job(path: Path, regions: str) -> Path:
    path.write_text(
        f"name: anyjob\nresources:\n  gpu: T4:1\n  regions: {regions}\n"
        "run: 'mkdir -p out; echo fine > out/r.txt; echo job-ran'\nartifacts: [out/]\nmax_duration: 10m\n"
    )
    return path


@pytest.fixture
def aws_env(
    moto: Moto,
    aws_sim: AwsVmSimulator,
    gpucloud_home: Path,
    tmp_path: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[dict[str, str]]:
    """moto + simulator, and no Azure at all; cwd = tmp_path."""
    monkeypatch.chdir(tmp_path)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "GPUCLOUD_TEST_", "AZURE_", "IDENTITY_", "GPUCLOUD_AZURE"))
    }
    env.update(moto.env)
    env.update(
        {
            "GPUCLOUD_HOME": str(gpucloud_home),
            "CI": "true",
            "PYTHONPATH": str(REPO),
            "GPUCLOUD_SSH_CIDR": "203.0.113.7/32",
            "AZURE_CONFIG_DIR": str(tmp_path / "no-azure"),
            "GPUCLOUD_TEST_AWS_RECORD": str(SESSION_RECORD),
        }
    )  # the hooks that answer for placement groups
    yield env


def test_cloud_any_without_aws_credentials_goes_on_to_azure(
    azure_env: dict[str, str],
    arm: FakeArm,  # noqa: F811
    azure_sim: AzureVmSimulator,
    tmp_path: Path,
) -> None:
    env = {
        **azure_env,
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    spec = any_cloud_job(tmp_path / "job.yaml", "[us-east-1, eastus]")
    out = cli("run", str(spec), "--json", env=env, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["status"] == "succeeded"
    assert (Path(doc["artifacts_dir"]) / "out" / "r.txt").read_text() == "fine\n"
    skipped = [m for m in messages(out.stderr) if "skipping" in m]
    assert len(skipped) == 1 and "AWS: no credentials found" in skipped[0] and "aws configure" in skipped[0]
    assert "internal error" not in out.stderr and "quota" not in out.stderr
    assert leftovers(arm) == []
    check = json.loads(cli("check", "--json", env=env, timeout=180).stdout)
    azure = next(c for c in check["clouds"] if c["cloud"] == "azure")
    assert azure["usable"] and azure["identity"]["tenant"] == arm.tenant_id
    assert azure["identity"]["subscription"] == arm.subscription_id and azure["regions"] == sorted(FAKE_LOCATIONS)
    assert check["usable"] == ["azure"]


def test_cloud_any_without_azure_credentials_goes_on_to_aws(
    aws_env: dict[str, str],
    moto: Moto,  # noqa: F811
    tmp_path: Path,
) -> None:
    # eastus (Azure, $0.526/h) comes before eu-west-1 (AWS, $0.587/h) in the plan.
    spec = any_cloud_job(tmp_path / "job.yaml", "[eastus, eu-west-1]")
    out = cli("run", str(spec), "--json", module=AWS_CLI, env=aws_env, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["status"] == "succeeded"
    skipped = [m for m in messages(out.stderr) if "skipping" in m]
    assert len(skipped) == 1 and "Azure" in skipped[0] and "AZURE_SUBSCRIPTION_ID" in skipped[0], out.stderr
    assert "internal error" not in out.stderr
    assert tagged_alive(moto, doc["run_id"]) == []
    check = json.loads(cli("check", "--json", "--cloud", "aws", module=AWS_CLI, env=aws_env, timeout=180).stdout)
    (aws,) = check["clouds"]
    assert aws["usable"] and aws["identity"]["account"] and aws["identity"]["arn"].startswith("arn:aws")
    assert "us-east-1" in aws["regions"] and aws["seconds"] < 10
