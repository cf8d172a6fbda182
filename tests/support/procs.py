"""Processes the tests start: stopping the helper servers (sshd, Azurite, ...) politely, then for
sure, and a `gpucloud run` followed until its job has started."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.cli import start_cli


def stop_process(proc: subprocess.Popen | None, grace: float = 5.0) -> None:
    """SIGTERM, wait `grace` seconds, then SIGKILL; a process that already ended is left alone."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace)


def gpucloud_until_started(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """`python -m gpucloud ARGS` with its output piped, returned once the job printed "started" on
    stdout (or stdout ended): the point where a test interrupts a running job."""
    proc = start_cli(*args, env=env, cwd=cwd)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "started" in line:
            break
    return proc
