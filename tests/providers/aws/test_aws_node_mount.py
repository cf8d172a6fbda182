"""`mode: mount` under the node's own identity on AWS (docs/DATA.md, "Mounted inputs"): the guest's
rclone signs as the instance's role (`env_auth`, credentials from the simulator's IMDSv2), through
the strict SigV4 front (tests/support/s3_sigv4.py) which knows only the CLI's key and the role's
credentials IMDS served, and allows a role only what its inline policies allow. A federation token
(what the launcher handed the node before) is a key the front does not know: the listing fails.

And before launch: a job that runs only on AWS needs no GetFederationToken (SSO, assumed-role and
OIDC callers cannot call it) and no 36-hour limit; a job that may run elsewhere still does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucloud.errors import UserError
from gpucloud.run.data_grants import check
from gpucloud.spec.load import parse_spec
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.moto_server import Moto, moto, moto_server  # noqa: F401
from tests.support.node_roles import role_policies
from tests.support.s3_sigv4 import StrictS3

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
FUSE = shutil.which("rclone") and shutil.which("fusermount3") and os.path.exists("/dev/fuse")


@pytest.fixture
def front(moto: Moto, aws_sim: AwsVmSimulator) -> Iterator[StrictS3]:  # noqa: F811
    """The front as the S3 endpoint of the CLI and the guests alike (rclone does not proxy loopback)."""
    strict = StrictS3(moto.endpoint).start()
    strict.register("testing", "testing", "", time.time() + 3600)
    aws_sim.on_credentials.append(strict.register)
    try:
        yield strict
    finally:
        aws_sim.on_credentials.clear()
        strict.stop()


@pytest.mark.skipif(not FUSE, reason="needs rclone and FUSE (.ci/run installs rclone and fuse3)")
def test_the_node_mounts_under_its_own_role(
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    front: StrictS3,
    gpucloud_home: Path,
    tmp_path: Path,
) -> None:
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="gc-node-mount")
    s3.put_object(Bucket="gc-node-mount", Key="set/a.txt", Body=b"alpha\n")
    s3.put_object(Bucket="gc-node-mount", Key="other/secret.txt", Body=b"no\n")
    front.authorize = role_policies(moto)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUCLOUD_TEST_", "AZURE_"))}
    env.update(moto.env)
    env.update({"GPUCLOUD_HOME": str(gpucloud_home), "CI": "true", "PYTHONPATH": str(REPO)})
    env.update({"GPUCLOUD_SSH_CIDR": "203.0.113.7/32", "AWS_ENDPOINT_URL_S3": front.base})
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: nmount\nresources:\n  cloud: aws\n  regions: [us-east-1]\n  gpu: T4:1\n"
        "inputs:\n  d/: {source: s3://gc-node-mount/set, mode: mount}\n"
        "run: |\n  cat d/a.txt > got.txt\n  ls d > listing.txt\nartifacts: [got.txt, listing.txt]\n"
        "max_duration: 48h\n"  # past the 36 hours a federation token lasts: the role has no such limit
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.aws_cli", "run", str(job), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    listed = [a for a in front.answers if a[1] == "/gc-node-mount" or a[1] == "/gc-node-mount/"]
    assert proc.returncode == 0, f"{listed[-5:]} {front.answers[-10:]}\n{proc.stderr[-3000:]}"
    doc = json.loads(proc.stdout)
    got = Path(doc["artifacts_dir"])
    assert (got / "got.txt").read_text() == "alpha\n" and (got / "listing.txt").read_text() == "a.txt\n"
    assert any(code == 200 and who == "node" for _, _, code, who in listed), listed
    reads = [a for a in front.answers if a[1] == "/gc-node-mount/set/a.txt"]
    assert reads and all(who == "node" for _, _, _, who in reads), reads


def test_an_aws_only_job_needs_no_federation_token(moto: Moto, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Credentials that cannot call GetFederationToken (as any SSO or role session): a job on AWS
    only is planned (its nodes mount as themselves), one that may run locally is refused."""
    from gpucloud.providers.aws.session import reset_shared
    from tests.support.moto_iam import enforced, iam_user

    s3 = moto.client("s3")
    s3.create_bucket(Bucket="gc-node-mount-iam")
    s3.put_object(Bucket="gc-node-mount-iam", Key="set/a", Body=b"a")
    reads = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::gc-node-mount-iam"},
            {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::gc-node-mount-iam/set/*"},
        ],
    }
    mount = "inputs: {d/: {source: s3://gc-node-mount-iam/set, mode: mount}}\nrun: x\n"
    on_aws = parse_spec(f"name: m\nresources: {{cloud: aws, gpu: 'T4:1'}}\nmax_duration: 2d\n{mount}", "job.yaml")
    local = parse_spec(f"name: m\nresources: {{cloud: local}}\n{mount}", "job.yaml")
    with enforced(moto):
        for key, value in iam_user(moto, "gc-node-mount-reader", reads).items():
            monkeypatch.setenv(key, value)
        reset_shared()
        try:
            plan = check(on_aws)
            with pytest.raises(UserError, match="GetFederationToken"):
                check(local)
        finally:
            reset_shared()
    assert plan.inputs[0].by_node and plan.inputs[0].region == "us-east-1"
    long_local = parse_spec(f"name: m\nresources: {{cloud: local}}\nmax_duration: 2d\n{mount}", "job.yaml")
    with pytest.raises(UserError, match="at most 36 hours"):
        check(long_local)


def test_iam_policy_data_asks_no_federation_token_for_an_aws_only_job(tmp_path: Path) -> None:
    from tests.support.cli import cli

    def data_actions(cloud: str) -> set[str]:
        job = tmp_path / f"{cloud}.yaml"
        gpu = ", gpu: 'T4:1'" if cloud == "aws" else ""
        mount = "inputs: {d/: {source: s3://gc-in/set, mode: mount}}\nrun: x\n"
        job.write_text(f"name: p\nresources: {{cloud: {cloud}{gpu}}}\n{mount}")
        policy = json.loads(cli("iam-policy", "aws", "--data", str(job), cwd=tmp_path, check=True).stdout)
        data = [s["Action"] for s in policy["Statement"] if s["Sid"].startswith("Data")]
        return {a for a in data if isinstance(a, str)}

    assert "sts:GetFederationToken" in data_actions("local")
    assert "sts:GetFederationToken" not in data_actions("aws")
    assert "s3:GetObject" in data_actions("aws")
