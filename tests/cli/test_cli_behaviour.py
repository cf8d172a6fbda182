"""What the CLI does with its flags and with missing credentials, as a user meets it: the real CLI
in a subprocess, no cloud reached (no credentials at all is what a new user's machine has)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from gpucloud.catalog import load_catalog
from tests.support.cli import cli
from tests.support.text import flat

REPO = Path(__file__).resolve().parents[2]
NO_GPU = "name: nogpu\nrun: echo hello-from-the-job\nmax_duration: 5m\n"


def no_cloud_env(home: Path, **extra: str) -> dict[str, str]:
    """No cloud credentials at all, no CI (so that `run` may prompt when stdin is a terminal)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GPUCLOUD_", "IDENTITY_"))}
    env.pop("CI", None)
    env.update(
        {
            "GPUCLOUD_HOME": str(home / "gpucloud"),
            "PYTHONPATH": str(REPO),
            "COLUMNS": "80",
            "AWS_SHARED_CREDENTIALS_FILE": str(home / "no-credentials"),
            "AWS_CONFIG_FILE": str(home / "no-config"),
            "AWS_EC2_METADATA_DISABLED": "true",
            "AZURE_CONFIG_DIR": str(home / "no-azure"),
        }
    )
    env.update(extra)
    return env


@pytest.mark.parametrize("command", ["plan", "render", "run"])
def test_cloud_flag_applies_before_validation(tmp_path: Path, command: str) -> None:
    (tmp_path / "job.yaml").write_text(NO_GPU)
    env = no_cloud_env(tmp_path)
    out = cli(command, "job.yaml", "--cloud", "local", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert "needs a GPU" not in out.stderr
    if command == "run":
        assert "hello-from-the-job" in out.stdout
    if command == "plan":
        assert "local" in out.stdout and "localhost" in out.stdout
    refused = cli(command, "job.yaml", cwd=tmp_path, env=env)  # without the flag the file asks for any cloud
    assert refused.returncode == 2 and "job.yaml:1: resources: needs a GPU or an instance type" in refused.stderr
    assert "--cloud" in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.parametrize("command", ["plan", "run"])
def test_a_job_asking_what_the_provider_cannot_do_is_refused_at_plan_time(tmp_path: Path, command: str) -> None:
    """`spot: true` on a provider without spot (its Capabilities say so) is refused with the field
    and the fix, exit 2, before anything starts; never quietly planned on-demand."""
    (tmp_path / "job.yaml").write_text(
        "name: s\nresources: {cloud: local, spot: true}\nrun: echo ran\nmax_duration: 5m\n"
    )
    yes = ("--yes",) if command == "run" else ()
    out = cli(command, "job.yaml", *yes, cwd=tmp_path, env=no_cloud_env(tmp_path))
    assert out.returncode == 2, out.stderr
    assert "job.yaml: resources.spot: local cannot launch spot machines" in flat(out.stderr)
    assert "Set spot: false" in flat(out.stderr) and "Traceback" not in out.stderr and "ran" not in out.stdout
    flag = cli(command, "job.yaml", *yes, "--no-spot", cwd=tmp_path, env=no_cloud_env(tmp_path))
    assert flag.returncode == 0, flag.stderr
    assert "ran" in flag.stdout if command == "run" else "localhost" in flag.stdout


def test_suggested_gpu_and_instance_types_are_offered_today(tmp_path: Path) -> None:
    """The examples the errors suggest must be things one can buy, not retired offerings."""
    (tmp_path / "job.yaml").write_text(NO_GPU)
    out = cli("validate", "job.yaml", cwd=tmp_path, env=no_cloud_env(tmp_path))
    assert out.returncode == 2 and "gpu: T4:1" in out.stderr and "instance_type: g4dn.xlarge" in out.stderr, out.stderr
    assert "K80" not in out.stderr and "p2." not in out.stderr
    (tmp_path / "bad.yaml").write_text("name: x\nresources: {gpu: 'T4:two', instance_type: 'no such'}\nrun: x\n")
    bad = cli("validate", "bad.yaml", cwd=tmp_path, env=no_cloud_env(tmp_path))
    text = bad.stderr
    assert bad.returncode == 2 and "K80" not in text and "p2." not in text and "NC6s_v3" not in text, text
    catalog = load_catalog()
    live = {o.instance_type for o in catalog.offerings if o.status == "active"}
    assert {"g4dn.xlarge", "Standard_NC4as_T4_v3"} <= live
    assert any(o.gpu == "T4" and o.status == "active" for o in catalog.offerings)


def _on_tty(args: list[str], env: dict[str, str], cwd: Path, answer: bytes) -> tuple[int, str]:
    """The CLI with a terminal on stdin (so that it may prompt), answering the prompt if one comes."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpucloud", *args],
        cwd=cwd,
        env=env,
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(slave)
    os.write(master, answer)
    try:
        _, stderr = proc.communicate(timeout=120)
    finally:
        os.close(master)
    return proc.returncode, stderr


T4_ANY = "name: anyjob\nresources:\n  gpu: T4:1\nrun: echo hi\nmax_duration: 10m\n"


def test_run_checks_credentials_before_asking_to_launch(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(T4_ANY)
    code, stderr = _on_tty(["run", "job.yaml"], no_cloud_env(tmp_path), tmp_path, b"y\n")
    assert code == 78, stderr
    assert "Launch it?" not in stderr and "attempt" not in stderr, stderr
    for title in ("AWS", "Azure"):
        lines = [line for line in stderr.splitlines() if f"{title}: no credentials found." in line]
        assert len(lines) == 1, stderr  # each reason once
    assert "gpucloud check" in stderr
    runs = json.loads(cli("ls", "--json", cwd=tmp_path, env=no_cloud_env(tmp_path)).stdout)
    assert runs == []  # nothing was started, nothing to clean up


def test_clouds_without_working_credentials_are_named_once_and_never_prompted_for(tmp_path: Path) -> None:
    """One cloud without credentials, the other with credentials whose endpoint is dead (nothing
    is reached): both are found before the prompt, each named once, and the run exits 78 without
    asking. A cloud that works is offered after the others are skipped:
    tests/run/test_launch_credentials.py (moto and the fake ARM)."""
    (tmp_path / "job.yaml").write_text(T4_ANY)
    env = no_cloud_env(
        tmp_path,
        AWS_ACCESS_KEY_ID="AKIAFAKE",
        AWS_SECRET_ACCESS_KEY="fake",
        AWS_ENDPOINT_URL="http://127.0.0.1:9",
        AWS_DEFAULT_REGION="us-east-1",
        COLUMNS="80",
    )
    code, stderr = _on_tty(["run", "job.yaml"], env, tmp_path, b"n\n")
    assert code == 78 and "Launch it?" not in stderr, stderr
    text = flat(stderr)
    assert text.count("Azure: no credentials found.") == 1 and text.count("no credentials found") == 1, stderr
    assert text.count("AWS: could not reach http://127.0.0.1:9") == 1, stderr
    assert text.count("AWS_ENDPOINT_URL is set") == 1, stderr
    assert all(len(line) <= 80 for line in stderr.splitlines()), stderr
    out = cli("run", "job.yaml", "--yes", cwd=tmp_path, env=env)
    assert out.returncode == 78, out.stderr
    assert flat(out.stderr).count("127.0.0.1:9") == 2, out.stderr  # the endpoint and its fix, once
    assert flat(out.stderr).count("AWS_ENDPOINT_URL is set") == 1, out.stderr
