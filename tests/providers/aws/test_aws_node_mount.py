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
from tests.support.node_roles import node_roles, role_policies
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
    assert proc.returncode == 0, f"{listed[-5:]} {aws_sim.imds_log[-8:]}\n{proc.stderr[-3000:]}"
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


def test_a_relaunch_by_watch_gets_its_data_policy_and_grants(
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    gpucloud_home: Path,
    tmp_path: Path,
) -> None:
    """`run --detach`, a preemption, and `gpucloud watch` relaunching: the new attempt's role gets
    the job's data policy and its nodes their grants from the watcher (before: neither, so the
    relaunched node waited for its grants until the deadline)."""
    from gpucloud.providers.aws.identity import DATA_POLICY_NAME
    from tests.support.polling import wait_until

    moto.client("s3").create_bucket(Bucket="gc-watch-out")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUCLOUD_TEST_", "AZURE_"))}
    env.update(moto.env)
    env.update({"GPUCLOUD_HOME": str(gpucloud_home), "CI": "true", "PYTHONPATH": str(REPO)})
    env["GPUCLOUD_SSH_CIDR"] = "203.0.113.7/32"
    gate = tmp_path / "gate"
    script = (
        f'while [ ! -e "$GPUCLOUD_PREEMPTED_FILE" ] && [ ! -e {gate} ]; do sleep 0.3; done\n'
        f"[ -e {gate} ] || exit 143\nmkdir -p res && echo second > res/x.txt\n"
    )
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: wdata\nresources:\n  cloud: aws\n  regions: [us-east-1]\n  gpu: T4:1\n  spot: true\n"
        f"recovery: {{on: [preemption], max_restarts: 1}}\nrun: {json.dumps(script)}\n"
        "outputs:\n  res: s3://gc-watch-out/results\nmax_duration: 20m\n"
    )

    def aws_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tests.support.aws_cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=tmp_path,
        )

    started = aws_cli("run", str(job), "--detach")
    assert started.returncode == 0, started.stderr[-3000:]
    run_id = started.stdout.strip().splitlines()[-1]
    assert wait_until(lambda: aws_cli("preempt", run_id).returncode == 0, timeout=120)
    watcher = subprocess.Popen(
        [sys.executable, "-m", "tests.support.aws_cli", "watch", run_id, "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    admitted: set[str] = set()  # roles seen with the data policy: the launcher's attempt, then the relaunch

    def two_admitted() -> bool:
        iam = moto.client("iam")
        for role in node_roles(moto):
            try:
                if DATA_POLICY_NAME in iam.list_role_policies(RoleName=role)["PolicyNames"]:
                    admitted.add(role)
            except Exception:  # noqa: BLE001 - deleted meanwhile
                pass
        return len(admitted) >= 2

    try:
        wait_until(lambda: two_admitted() or watcher.poll() is not None, timeout=180)
        gate.write_text("go")
        out, err = watcher.communicate(timeout=240)
    finally:
        watcher.kill()
    assert len(admitted) == 2, (admitted, err[-3000:])
    assert watcher.returncode == 0 and json.loads(out)["status"] == "succeeded", err[-3000:]
    objs = moto.client("s3").list_objects_v2(Bucket="gc-watch-out", Prefix="results/").get("Contents", [])
    assert [o["Key"] for o in objs] == ["results/x.txt"], err[-3000:]
