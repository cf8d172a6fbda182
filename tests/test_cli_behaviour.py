"""What the CLI does with its flags and with missing credentials, as a user meets it: the real CLI
in a subprocess, no cloud reached (no credentials at all is what a new user's machine has)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucloud.catalog import load_catalog

REPO = Path(__file__).resolve().parent.parent
NO_GPU = "name: nogpu\nrun: echo hello-from-the-job\nmax_duration: 5m\n"


def no_cloud_env(home: Path, **extra: str) -> dict[str, str]:
    """No cloud credentials at all, no CI (so that `run` may prompt when stdin is a terminal)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GPUCLOUD_", "IDENTITY_"))}
    env.pop("CI", None)
    env.update({"GPUCLOUD_HOME": str(home / "gpucloud"), "PYTHONPATH": str(REPO), "COLUMNS": "80",
                "AWS_SHARED_CREDENTIALS_FILE": str(home / "no-credentials"), "AWS_CONFIG_FILE": str(home / "no-config"),
                "AWS_EC2_METADATA_DISABLED": "true", "AZURE_CONFIG_DIR": str(home / "no-azure")})
    env.update(extra)
    return env


def cli(env: dict[str, str], *args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpucloud", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, input=stdin)


@pytest.mark.parametrize("command", ["plan", "render", "run"])
def test_cloud_flag_applies_before_validation(tmp_path: Path, command: str) -> None:
    (tmp_path / "job.yaml").write_text(NO_GPU)
    env = no_cloud_env(tmp_path)
    out = cli(env, command, "job.yaml", "--cloud", "local", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "needs a GPU" not in out.stderr
    if command == "run":
        assert "hello-from-the-job" in out.stdout
    if command == "plan":
        assert "local" in out.stdout and "localhost" in out.stdout
    refused = cli(env, command, "job.yaml", cwd=tmp_path)  # without the flag the file asks for any cloud
    assert refused.returncode == 2 and "job.yaml:1: resources: needs a GPU or an instance type" in refused.stderr
    assert "--cloud" in refused.stderr and "Traceback" not in refused.stderr


def test_suggested_gpu_and_instance_types_are_offered_today(tmp_path: Path) -> None:
    """The examples the errors suggest must be things one can buy, not retired offerings."""
    (tmp_path / "job.yaml").write_text(NO_GPU)
    out = cli(no_cloud_env(tmp_path), "validate", "job.yaml", cwd=tmp_path)
    assert out.returncode == 2 and "gpu: T4:1" in out.stderr and "instance_type: g4dn.xlarge" in out.stderr, out.stderr
    assert "K80" not in out.stderr and "p2." not in out.stderr
    (tmp_path / "bad.yaml").write_text("name: x\nresources: {gpu: 'T4:two', instance_type: 'no such'}\nrun: x\n")
    bad = cli(no_cloud_env(tmp_path), "validate", "bad.yaml", cwd=tmp_path)
    text = bad.stderr
    assert bad.returncode == 2 and "K80" not in text and "p2." not in text and "NC6s_v3" not in text, text
    catalog = load_catalog()
    live = {o.instance_type for o in catalog.offerings if o.status == "active"}
    assert {"g4dn.xlarge", "Standard_NC4as_T4_v3"} <= live
    assert any(o.gpu == "T4" and o.status == "active" for o in catalog.offerings)
