"""Shared by the local-provider benchmarks (bench_run.py, bench_max_duration.py): a throwaway
GPUCLOUD_HOME with a jobs folder outside it, and the wall times of `gpucloud run` there."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def throwaway_home() -> Iterator[tuple[Path, dict[str, str]]]:
    """(jobs folder, environment): the jobs folder is the workdir a run packs and uploads, so
    GPUCLOUD_HOME stays outside it."""
    with tempfile.TemporaryDirectory(prefix="gpucloud-bench-") as tmp:
        root = Path(tmp)
        jobs = root / "jobs"
        jobs.mkdir()
        yield jobs, {**os.environ, "GPUCLOUD_HOME": str(root / "home"), "CI": "true"}


def run_walls(job: Path, env: dict[str, str], runs: int) -> list[float]:
    """Wall seconds of `gpucloud run JOB --cloud local`, `runs` times; a failed run stops the bench."""
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "gpucloud", "run", str(job), "--cloud", "local"],
            cwd=job.parent,
            env=env,
            capture_output=True,
        )
        walls.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"run failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    return walls
