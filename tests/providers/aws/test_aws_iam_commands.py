"""The commands the other IAM-enforced tests leave out, each with only the policy `gpucloud
iam-policy aws` prints (moto deciding every call): `watch` and `collect` of detached runs, and
`image ls`; with ec2:DescribeImages taken out, `image ls` fails naming the action and the policy
command. (run, down, gc, check, image build/rm: test_aws_iam_enforced.py; catalog refresh:
test_aws_iam_catalog.py; setup and the guide's check/plan/run/ls/gc: test_aws_guide.py.)"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucloud.providers.aws.policy import policy_document
from tests.support.aws_runs import AWS_CLI
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.cli import cli
from tests.support.moto_iam import enforced, iam_user
from tests.support.moto_server import Moto, moto, moto_server, tagged_alive  # noqa: F401

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
RUN_ID = re.compile(r"run ([a-z0-9-]+-\d{8}-\d{6}-[0-9a-f]{4})")
JOB = (
    "name: iam-cmd\nresources:\n  cloud: aws\n  regions: [us-east-1]\n  gpu: T4:1\n"
    "run: 'mkdir -p out; echo cmd-ok > out/r.txt'\nartifacts: [out/]\nmax_duration: 10m\n"
)


@pytest.fixture
def env(
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    gpucloud_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[dict[str, str]]:
    monkeypatch.chdir(tmp_path)
    out = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUCLOUD_TEST_", "AZURE_"))}
    out.update(moto.env)
    out.update({"GPUCLOUD_HOME": str(gpucloud_home), "CI": "true", "PYTHONPATH": str(REPO)})
    out.pop("GPUCLOUD_AZURE_ARM_ENDPOINT", None)
    with enforced(moto):
        yield out
    assert tagged_alive(moto) == []


def ok(out: subprocess.CompletedProcess[str]) -> str:
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "AccessDenied" not in text and "not authorized" not in text, text[-3000:]
    return text


def detached(env: dict[str, str], tmp_path: Path) -> str:
    spec = tmp_path / "job.yaml"
    spec.write_text(JOB)
    found = RUN_ID.search(ok(cli("run", str(spec), "--yes", "--detach", env=env, timeout=240, module=AWS_CLI)))
    assert found
    return found[1]


def test_watch_collect_and_image_ls_need_nothing_beyond_the_policy(
    env: dict[str, str],
    moto: Moto,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = {**env, **iam_user(moto, "gpucloud-cmds", policy_document())}
    ok(cli("watch", detached(env, tmp_path), env=env, timeout=240, module=AWS_CLI))
    run_id = detached(env, tmp_path)
    deadline = time.monotonic() + 120
    while True:  # collect answers 75 while the run is still going
        out = cli("collect", run_id, env=env, timeout=240, module=AWS_CLI)
        if out.returncode != 75 or time.monotonic() > deadline:
            break
        time.sleep(2)
    ok(out)
    assert (tmp_path / "gpucloud-runs" / run_id).is_dir()
    ok(cli("image", "ls", "--cloud", "aws", "--region", "us-east-1", env=env, timeout=240, module=AWS_CLI))


def test_image_ls_without_describe_images_names_the_action(
    env: dict[str, str],
    moto: Moto,  # noqa: F811
) -> None:
    doc = copy.deepcopy(policy_document())
    for statement in doc["Statement"]:
        actions = [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]
        statement["Action"] = [a for a in actions if a != "ec2:DescribeImages"]
    doc["Statement"] = [s for s in doc["Statement"] if s["Action"]]
    env = {**env, **iam_user(moto, "gpucloud-noimages", doc)}
    out = cli("image", "ls", "--cloud", "aws", "--region", "us-east-1", env=env, timeout=240, module=AWS_CLI)
    text = " ".join((out.stdout + out.stderr).split())
    assert out.returncode not in (0, 70), text[-3000:]
    assert "ec2:DescribeImages" in text and "gpucloud iam-policy aws" in text, text[-3000:]
    assert "Traceback" not in text
