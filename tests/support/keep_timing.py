"""A kept run's latency, as a user sees it: the seconds from starting a command to the first line of
the job's own output on its stdout, for the cold run and for `run --on` on the kept machine. Shared by
the kept-machine tests of each provider; `bench/bench_keep.py` collects what they measure
(GPUCLOUD_BENCH_KEEP names a JSON-lines file to append to)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

FIRST_LINE_BUDGET_S = 5.0


def timed_first_line(
    args: list[str], *, env: Mapping[str, str], cwd: Path, marker: str, module: str = "gpucloud", timeout: float = 240
) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Run the CLI; seconds until a stdout line holding `marker` appeared, and the finished process."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read() if proc.stderr else ""), daemon=True)
    reader.start()
    seen, out = float("inf"), []
    assert proc.stdout is not None
    for line in proc.stdout:
        out.append(line)
        if marker in line and seen == float("inf"):
            seen = time.monotonic() - t0
    proc.wait(timeout=timeout)
    reader.join(10)
    return seen, subprocess.CompletedProcess(args, proc.returncode, "".join(out), "".join(err))


def record(provider: str, cold_s: float, kept_s: float) -> None:
    """Append one measurement for bench/bench_keep.py (when it asked for them)."""
    path = os.environ.get("GPUCLOUD_BENCH_KEEP")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"provider": provider, "cold_s": round(cold_s, 2), "kept_s": round(kept_s, 2)}) + "\n")
