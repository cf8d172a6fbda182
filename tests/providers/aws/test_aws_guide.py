"""docs/AWS.md, run as written against moto under IAM enforcement: its `gpucloud` commands (the
lines of its ```bash blocks, in order) with its job file. `setup aws` runs as the administrator;
every later command runs as a new IAM user given only the runner policies setup created (attached
as the guide says). It ends in a finished run and an account with nothing of gpucloud's left: no
instance, security group, key pair, volume, deadline schedule or per-run role."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpucloud.providers.aws.setup import runner_names
from tests.support.aws_setup import remove_setup_pieces
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.moto_iam import enforced
from tests.support.moto_server import ACCOUNT, Moto, moto, moto_server, tagged_alive  # noqa: F401

REPO = Path(__file__).resolve().parents[3]
GUIDE = REPO / "docs" / "AWS.md"
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def guide() -> tuple[list[str], str]:
    """The guide's gpucloud commands in order, and its job file (the one YAML block)."""
    text = GUIDE.read_text()
    commands = [
        line.strip()
        for block in re.findall(r"```bash\n(.*?)```", text, re.S)
        for line in block.splitlines()
        if line.strip().startswith("gpucloud ")
    ]
    jobs = re.findall(r"```yaml\n(.*?)```", text, re.S)
    assert len(jobs) == 1, "the guide has one job file"
    return commands, jobs[0]


def runner_user(moto: Moto) -> dict[str, str]:  # noqa: F811
    """An IAM user with only the runner policies attached (as the guide's step 2 says)."""
    iam = moto.client("iam")
    name = "guide-runner"
    try:
        iam.create_user(UserName=name)
    except iam.exceptions.EntityAlreadyExistsException:
        for old in iam.list_access_keys(UserName=name)["AccessKeyMetadata"]:
            iam.delete_access_key(UserName=name, AccessKeyId=old["AccessKeyId"])
    for policy in runner_names():
        iam.attach_user_policy(UserName=name, PolicyArn=f"arn:aws:iam::{ACCOUNT}:policy/{policy}")
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}


def detach(moto: Moto) -> None:  # noqa: F811
    iam = moto.client("iam")
    for policy in runner_names():
        try:
            iam.detach_user_policy(UserName="guide-runner", PolicyArn=f"arn:aws:iam::{ACCOUNT}:policy/{policy}")
        except iam.exceptions.NoSuchEntityException:
            pass


def test_the_aws_guide_runs_in_order_and_leaves_an_empty_account(
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    gpucloud_home: Path,
    tmp_path: Path,
) -> None:
    commands, job = guide()
    assert [c.split()[1] for c in commands] == ["setup", "check", "plan", "run", "ls", "gc"]
    (tmp_path / "first-job.yaml").write_text(job)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GPUCLOUD_AZURE"))}
    env.update(moto.env)
    env.update({"GPUCLOUD_HOME": str(gpucloud_home), "CI": "true", "PYTHONPATH": str(REPO)})
    try:
        user: dict[str, str] = {}
        with enforced(moto):
            for command in commands:
                argv = command.split()[1:]
                if argv[0] != "setup" and not user:  # after setup: the runner, as step 2 attaches it
                    user = {**env, **runner_user(moto)}
                as_user = user or env
                out = subprocess.run(
                    [sys.executable, "-m", "tests.support.aws_cli", *argv],
                    env=as_user,
                    capture_output=True,
                    text=True,
                    timeout=300,
                    cwd=tmp_path,
                )
                text = out.stdout + out.stderr
                assert out.returncode == 0, f"{command}: exit {out.returncode}\n{text[-3000:]}"
                assert "AccessDenied" not in text and "not authorized" not in text, f"{command}\n{text[-3000:]}"
                if argv[0] == "run":
                    assert "Tesla T4" in text, text[-3000:]  # the job's own output: nvidia-smi on the node
        assert tagged_alive(moto) == []
        schedules = moto.client("scheduler").list_schedules(NamePrefix="gpucloud-")["Schedules"]
        assert schedules == []
        assert moto.client("iam").list_roles(PathPrefix="/gpucloud/")["Roles"] == []
        profiles = moto.client("iam").list_instance_profiles(PathPrefix="/gpucloud/")["InstanceProfiles"]
        assert profiles == []
    finally:
        detach(moto)
        remove_setup_pieces(moto)
