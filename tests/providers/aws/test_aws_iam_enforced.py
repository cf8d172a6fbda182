"""An AWS account that enforces IAM: moto decides every call of the CLI, made with an IAM user whose
ONLY policy is what `gpucloud iam-policy aws` prints. Single node with ssh, two nodes, spot, an
image build and removal, `check`, `down` and `gc` succeed; with a statement removed the run ends
with exit 78 naming the refused action. Where moto decides less than AWS (resources, condition
keys, presigned POST) tests/support/moto_iam.py says so, and tests/providers/aws/test_aws_policy.py's evaluator
checks those parts."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpucloud.providers.aws.policy import policy_document
from tests.support.aws_faults import RECORDED, SESSION_RECORD
from tests.support.aws_runs import AWS_CLI, RUN_ID
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.cli import cli
from tests.support.moto_iam import enforced, iam_user
from tests.support.moto_server import Moto, moto, moto_server, tagged_alive  # noqa: F401

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture
def env(
    moto: Moto,
    aws_sim: AwsVmSimulator,
    gpucloud_home: Path,
    tmp_path: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[dict[str, str]]:
    """The CLI's environment (moto, the test hooks for placement groups); IAM enforced meanwhile."""
    monkeypatch.chdir(tmp_path)
    out = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUCLOUD_TEST_", "AZURE_"))}
    out.update(moto.env)
    out.update(
        {
            "GPUCLOUD_HOME": str(gpucloud_home),
            "CI": "true",
            "PYTHONPATH": str(REPO),
            "GPUCLOUD_TEST_AWS_RECORD": str(SESSION_RECORD),
            "GPUCLOUD_SSH_CIDR": "203.0.113.7/32",
        }
    )
    out.pop("GPUCLOUD_AZURE_ARM_ENDPOINT", None)
    with enforced(moto):
        yield out
    assert tagged_alive(moto) == []


def job(path: Path, *, name: str, extra: str = "") -> Path:
    path.write_text(
        f"name: {name}\nresources:\n  cloud: aws\n  regions: [us-east-1]\n  gpu: T4:1\n{extra}"
        "run: 'mkdir -p out; echo iam-ok > out/r.txt; echo iam-ran'\nartifacts: [out/]\n"
        "max_duration: 10m\n"
    )
    return path


def ok(out: subprocess.CompletedProcess[str]) -> str:
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "AccessDenied" not in text and "UnauthorizedOperation" not in text, text[-3000:]
    return text


def test_the_printed_policy_is_all_a_real_account_needs(
    env: dict[str, str],
    moto: Moto,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = {**env, **iam_user(moto, "gpucloud-user", policy_document())}
    import boto3
    from botocore.exceptions import ClientError

    user = boto3.Session(
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    ).client("ec2", endpoint_url=moto.endpoint)
    with pytest.raises(ClientError, match="not authorized to perform: ec2:DescribeVpcEndpoints"):
        user.describe_vpc_endpoints()  # moto is deciding: an action outside the policy is refused
    # That probe is this test's own call, not one a command made: the policy test's record of what
    # runs call (shared by the worker's tests) must not count it.
    RECORDED.discard(("ec2", "DescribeVpcEndpoints"))
    with_ssh = job(tmp_path / "ssh.yaml", name="iam-ssh", extra="  ssh: true\n")
    assert "iam-ran" in ok(cli("run", str(with_ssh), "--yes", env=env, timeout=180, module=AWS_CLI))
    nodes = job(tmp_path / "nodes.yaml", name="iam-nodes")
    nodes.write_text(nodes.read_text() + "num_nodes: 2\n")
    ok(cli("run", str(nodes), "--yes", env=env, timeout=180, module=AWS_CLI))
    spot = job(tmp_path / "spot.yaml", name="iam-spot", extra="  spot: true\n")
    ok(cli("run", str(spot), "--yes", env=env, timeout=180, module=AWS_CLI))
    detached = RUN_ID.search(ok(cli("run", str(spot), "--yes", "--detach", env=env, timeout=180, module=AWS_CLI)))
    assert detached
    ok(cli("down", detached[1], "--yes", env=env, timeout=180, module=AWS_CLI))
    built = cli(
        "image",
        "build",
        str(with_ssh),
        "--cloud",
        "aws",
        "--region",
        "us-east-1",
        "--yes",
        "--json",
        env=env,
        timeout=180,
        module=AWS_CLI,
    )
    ok(built)
    ref = json.loads(built.stdout.strip().splitlines()[-1])["ref"]
    ok(cli("image", "rm", ref, "--cloud", "aws", "--region", "us-east-1", env=env, timeout=180, module=AWS_CLI))
    expired = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    stray = [{"Key": "gpucloud-run", "Value": "iam-stray"}, {"Key": "gpucloud-expires", "Value": expired}]
    moto.client("ec2").create_volume(
        AvailabilityZone="us-east-1a", Size=8, TagSpecifications=[{"ResourceType": "volume", "Tags": stray}]
    )
    assert "iam-stray" in ok(cli("gc", "--yes", env=env, timeout=180, module=AWS_CLI)) or tagged_alive(moto) == []
    ok(cli("check", "--cloud", "aws", env=env, timeout=180, module=AWS_CLI))


@pytest.mark.parametrize(
    ("sid", "actions"),
    [
        (
            "DescribeToPlanLaunchAndClean",
            {
                "ec2:DescribeImages",
                "ec2:DescribeVpcs",
                "ec2:DescribeSubnets",
                "ec2:DescribeInstanceTypeOfferings",
                "ec2:DescribeSecurityGroups",
            },
        ),
        ("RunObjects", {"s3:PutObject"}),
    ],
)
def test_a_policy_without_one_statement_is_refused_with_exit_78_naming_the_action(
    env: dict[str, str], moto: Moto, tmp_path: Path, sid: str, actions: set[str]
) -> None:  # noqa: F811
    doc = policy_document()
    doc["Statement"] = [s for s in doc["Statement"] if s["Sid"] != sid]
    env = {**env, **iam_user(moto, "gpucloud-short", doc)}
    out = cli("run", str(job(tmp_path / "job.yaml", name="iam-short")), "--yes", env=env, timeout=180, module=AWS_CLI)
    text = out.stdout + out.stderr
    assert out.returncode == 78, text[-3000:]
    named = set(re.findall(r"denied ([a-z0-9-]+:[A-Za-z0-9]+)", text))
    assert named and named <= actions, text[-3000:]
    assert "iam-policy aws" in text and "Traceback" not in text
