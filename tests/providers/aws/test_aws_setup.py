"""`gpucloud setup aws` against moto: it shows what it will create and asks (nothing without --yes
and a terminal), creates the deadline role and the runner policies once (a second run changes
nothing), updates a role whose trust was changed, and `check` reports each piece; `--print` gives
the same as AWS CLI commands."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucloud.providers.aws.setup import DEADLINE_INLINE, runner_documents, runner_names
from tests.support.aws_setup import remove_setup_pieces
from tests.support.cli import cli
from tests.support.moto_server import ACCOUNT, Moto, moto, moto_server  # noqa: F401

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture
def env(moto: Moto, gpucloud_home: Path) -> Iterator[dict[str, str]]:  # noqa: F811
    out = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GPUCLOUD_AZURE"))}
    out.update(moto.env)
    out.update({"GPUCLOUD_HOME": str(gpucloud_home), "PYTHONPATH": str(REPO)})
    yield out
    remove_setup_pieces(moto)


def test_setup_creates_each_piece_once_and_check_reports_them(env: dict[str, str], moto: Moto) -> None:  # noqa: F811
    iam = moto.client("iam")
    asked = cli("setup", "aws", env=env, stdin="")  # no terminal, no --yes: shows the pieces, creates nothing
    assert asked.returncode == 2, asked.stderr
    assert "role gpucloud-deadline" in asked.stderr and "--yes" in asked.stderr
    with pytest.raises(iam.exceptions.NoSuchEntityException):
        iam.get_role(RoleName="gpucloud-deadline")
    before = cli("check", "--cloud", "aws", "--json", env=env, stdin="")
    problems = json.loads(before.stdout)["clouds"][0]["problems"]
    assert any("gpucloud-deadline" in p["problem"] and "gpucloud setup aws" in p["fix"] for p in problems), problems

    first = cli("setup", "aws", "--yes", "--json", env=env, stdin="")
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    assert [p["state"] for p in doc["pieces"]] == ["present"] * (1 + len(runner_names()))
    assert "created role gpucloud-deadline" in first.stderr
    role = iam.get_role(RoleName="gpucloud-deadline")["Role"]
    trust = role["AssumeRolePolicyDocument"]
    assert trust["Statement"][0]["Principal"] == {"Service": "scheduler.amazonaws.com"}
    inline = iam.get_role_policy(RoleName="gpucloud-deadline", PolicyName=DEADLINE_INLINE)["PolicyDocument"]
    assert inline["Statement"][0]["Action"] == "ec2:TerminateInstances"
    for name, part in zip(runner_names(), runner_documents(), strict=True):
        policy = iam.get_policy(PolicyArn=f"arn:aws:iam::{ACCOUNT}:policy/{name}")["Policy"]
        version = iam.get_policy_version(PolicyArn=policy["Arn"], VersionId=policy["DefaultVersionId"])
        assert version["PolicyVersion"]["Document"] == part
    assert any("attach-role-policy" in line for line in doc["attach"])

    second = cli("setup", "aws", "--yes", env=env, stdin="")
    assert second.returncode == 0, second.stderr
    assert "created" not in second.stderr and "updated" not in second.stderr
    assert len([r for r in iam.list_roles()["Roles"] if r["RoleName"] == "gpucloud-deadline"]) == 1
    assert (
        len(iam.list_policy_versions(PolicyArn=f"arn:aws:iam::{ACCOUNT}:policy/{runner_names()[0]}")["Versions"]) == 1
    )

    after = cli("check", "--cloud", "aws", "--json", env=env, stdin="")
    cloud = json.loads(after.stdout)["clouds"][0]
    assert not [p for p in cloud["problems"] if "gpucloud-deadline" in p["problem"]], cloud["problems"]
    assert {s["piece"]: s["state"] for s in cloud["setup"]}["role gpucloud-deadline"] == "present"


def test_setup_puts_back_a_changed_trust_policy(env: dict[str, str], moto: Moto) -> None:  # noqa: F811
    iam = moto.client("iam")
    assert cli("setup", "aws", "--yes", env=env, stdin="").returncode == 0
    loose = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}],
    }
    iam.update_assume_role_policy(RoleName="gpucloud-deadline", PolicyDocument=json.dumps(loose))
    out = cli("setup", "aws", "--yes", env=env, stdin="")
    assert out.returncode == 0 and "updated role gpucloud-deadline" in out.stderr, out.stderr
    trust = iam.get_role(RoleName="gpucloud-deadline")["Role"]["AssumeRolePolicyDocument"]
    assert trust["Statement"][0]["Principal"] == {"Service": "scheduler.amazonaws.com"}


def test_print_gives_the_commands_and_creates_nothing(env: dict[str, str], moto: Moto) -> None:  # noqa: F811
    out = cli("setup", "aws", "--print", env=env, stdin="")
    assert out.returncode == 0, out.stderr
    assert "aws iam create-role --role-name gpucloud-deadline" in out.stdout
    assert f'"aws:SourceAccount": "{ACCOUNT}"' in out.stdout
    assert "aws iam create-policy --policy-name gpucloud-runner-1" in out.stdout
    iam = moto.client("iam")
    with pytest.raises(iam.exceptions.NoSuchEntityException):
        iam.get_role(RoleName="gpucloud-deadline")
