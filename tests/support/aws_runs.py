"""Runs on the AWS simulator (moto in server mode and the VM simulator) through the real CLI: the
environment a CLI subprocess needs, the CLI with the AWS test hooks (tests/support/aws_cli.py) in a
subprocess or in this process, a job file, and the run id a run prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.aws_faults import HOOKS, SESSION_RECORD, Fault, faults_env, install
from tests.support.aws_sim import AwsVmSimulator
from tests.support.cli import REPO, cli
from tests.support.moto_server import Moto

AWS_CLI = "tests.support.aws_cli"  # the real CLI plus the AWS test hooks
EXAMPLES = REPO / "examples"


@pytest.fixture
def aws_env(
    moto: Moto,
    aws_sim: AwsVmSimulator,
    gpucloud_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[dict[str, str]]:
    """moto + simulator; the environment a CLI subprocess needs; cwd = tmp_path."""
    monkeypatch.chdir(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUCLOUD_TEST_", "AZURE_"))}
    env.update(moto.env)
    env.update(
        {
            "GPUCLOUD_HOME": str(gpucloud_home),
            "CI": "true",
            "PYTHONPATH": str(REPO),
            "GPUCLOUD_TEST_AWS_RECORD": str(SESSION_RECORD),
            "GPUCLOUD_SSH_CIDR": "203.0.113.7/32",
        }
    )
    env.pop("GPUCLOUD_AZURE_ARM_ENDPOINT", None)
    yield env


@pytest.fixture
def inproc(aws_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """In-process CLI runs with the hooks installed and the waits shortened (restored after)."""
    from gpucloud.providers.aws import AwsProvider, reset_shared
    from gpucloud.providers.aws.channel import S3Channel

    install()
    HOOKS.reset()
    reset_shared(channels_only=True)  # each cell checks (and maybe creates) its buckets again
    for cls in (AwsProvider, S3Channel):
        for name in (
            "capabilities",
            "RETRY_ATTEMPTS",
            "RETRY_BASE_S",
            "RETRY_CAP_S",
            "POLL_S",
            "TERMINATE_TIMEOUT_S",
            "SG_DELETE_TIMEOUT_S",
            "PG_DELETE_TIMEOUT_S",
        ):
            if hasattr(cls, name):
                monkeypatch.setattr(cls, name, getattr(cls, name))
    from tests.support.aws_cli import make_fast

    make_fast()
    monkeypatch.setenv("GPUCLOUD_SSH_CIDR", "203.0.113.7/32")
    yield
    HOOKS.reset()


def hooked_cli(
    env: dict[str, str], *args: str, faults: list[Fault] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The CLI with the AWS test hooks, `faults` injected into its botocore calls."""
    env = dict(env)
    if faults:
        env["GPUCLOUD_TEST_AWS_FAULTS"] = faults_env(faults)
    return cli(*args, env=env, timeout=timeout, module=AWS_CLI)


def plain_cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m gpucloud ARGS` with no test hooks at all: only the moto endpoint and credentials."""
    from tests.support.aws_faults import PLACEMENT_ENV

    env = {k: v for k, v in env.items() if k != PLACEMENT_ENV and not k.startswith("GPUCLOUD_TEST_")}
    return cli(*args, env=env, timeout=timeout)


def start_hooked_cli(env: dict[str, str], *args: str, faults: list[Fault] | None = None) -> subprocess.Popen[str]:
    """The hooked CLI started, not waited for (a test signals or kills it mid-run)."""
    env = dict(env)
    if faults:
        env["GPUCLOUD_TEST_AWS_FAULTS"] = faults_env(faults)
    return subprocess.Popen(
        [sys.executable, "-m", AWS_CLI, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=os.getcwd(),
    )


_COMMAND: list[tuple[Any, Any]] = []  # (the Typer app, its click command), built once


def invoke(*args: str) -> tuple[int, str]:
    """The CLI in this process (typer's CliRunner): exit code and combined output. The app's
    click command is built once per process: typer rebuilds it on every invoke, reading the type
    hints of every command (0.2 CPU-s, more than a fault-matrix cell's own work)."""
    from unittest import mock

    import typer.main
    import typer.testing
    from typer.testing import CliRunner

    from gpucloud.cli.app import app

    if not _COMMAND or _COMMAND[0][0] is not app:
        _COMMAND[:] = [(app, typer.main.get_command(app))]
    command = _COMMAND[0][1]
    with mock.patch.object(typer.testing, "_get_command", lambda _app: command):
        result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def write_aws_job(
    path: Path,
    *,
    run: str,
    regions: str = "[us-east-1]",
    max_duration: str = "10m",
    name: str = "awsjob",
    ssh: bool = False,
    artifacts: str = "[]",
    gpu: str = "T4:1",
) -> Path:
    """A job file for the AWS cloud: one T4 in us-east-1 for 10 minutes unless told otherwise."""
    path.write_text(
        f"name: {name}\nresources:\n  cloud: aws\n  regions: {regions}\n  gpu: {gpu}\n"
        f"  ssh: {str(ssh).lower()}\nrun: {run}\nartifacts: {artifacts}\nmax_duration: {max_duration}\n"
    )
    return path


RUN_ID = re.compile(r"run ([a-z0-9-]+-\d{8}-\d{6}-[0-9a-f]{4})")


def run_id_in(output: str) -> str:
    """The run id the CLI printed somewhere in `output`."""
    m = RUN_ID.search(output)
    assert m, output[-2000:]
    return m.group(1)


def settle(sim: AwsVmSimulator, timeout: float = 20) -> None:
    """Let guests that are still running end (a killed CLI leaves its VM to finish by itself)."""
    sim.wait_idle(timeout)


def drop_bucket(moto: Moto, region: str) -> None:
    """So that the next run creates (and configures) the bucket again."""
    s3 = moto.client("s3", region)
    name = f"gpucloud-123456789012-{region}"
    try:
        objs = s3.list_objects_v2(Bucket=name).get("Contents", [])
    except Exception:  # noqa: BLE001 - no bucket yet
        return
    for o in objs:
        s3.delete_object(Bucket=name, Key=o["Key"])
    s3.delete_bucket(Bucket=name)
