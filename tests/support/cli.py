"""The gpucloud CLI in a subprocess, as a user runs it: the real entry point, its exit code and both
streams. One helper for every test module, so a change to how the CLI is started is made once."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# What a test's environment must not leak into a CLI that should see no cloud and a fixed width.
CLOUD_VARS = ("AWS_", "AZURE_", "IDENTITY_", "GPUCLOUD_AZURE", "GPUCLOUD_TEST_", "COLUMNS")


def cli(
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    timeout: float | None = 120,
    check: bool = False,
    module: str = "gpucloud",
    stdin: str | None = None,
    text: bool = True,
    terminal: int | None = None,
) -> subprocess.CompletedProcess[Any]:
    """`python -m MODULE ARGS` (MODULE `tests.support.aws_cli` is the same CLI with moto's gaps
    filled; `gpucloud.ui.ci` the CI helper). `env` is the whole environment (default: this
    process's, read at the call); `timeout` None waits as long as it takes; `check` asserts exit 0
    and shows both streams when it is not; `text=False` keeps the streams as bytes (a `\r` the test
    reads stays one); `terminal`: a pseudo-terminal's file descriptor as stdin (so the CLI may
    prompt), instead of `stdin`'s text."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=dict(os.environ if env is None else env),
        capture_output=True,
        text=text,
        timeout=timeout,
        **({"stdin": terminal} if terminal is not None else {"input": stdin}),
        check=False,
    )
    if check:
        assert proc.returncode == 0, f"{args}: rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def ci_env(**extra: str) -> dict[str, str]:
    """This process's environment with CI set (no prompts, no colour), plus `extra`."""
    return {**os.environ, "CI": "true", **extra}


def clean_env(columns: int = 80, **extra: str) -> dict[str, str]:
    """No cloud credentials, a terminal `columns` wide, CI (no prompts), this checkout importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLOUD_VARS)}
    return {**env, "CI": "true", "COLUMNS": str(columns), "PYTHONPATH": str(REPO), **extra}


def start_cli(*args: str, env: Mapping[str, str] | None = None, cwd: Path | str | None = None) -> subprocess.Popen[str]:
    """The CLI started, not waited for (a test reads it, signals it or kills it mid-run)."""
    return subprocess.Popen(
        [sys.executable, "-m", "gpucloud", *args],
        cwd=cwd,
        env=dict(os.environ if env is None else env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def home_env(home: Path, **extra: str) -> dict[str, str]:
    """CI with `home` as the state folder and no cloud's or gpucloud's variable from this environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GPUCLOUD_"))}
    return {**env, "GPUCLOUD_HOME": str(home), "CI": "true", "PYTHONPATH": str(REPO), **extra}
