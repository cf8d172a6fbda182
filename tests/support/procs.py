"""Stopping the helper servers the tests start (sshd, Azurite, ...): politely, then for sure."""

from __future__ import annotations

import subprocess


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
