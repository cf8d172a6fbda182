"""Does a local run cost more with a longer max_duration? The log channel's grant must not grow with
the deadline (one URL per log part would be 20,000 for the default 6 h).

Measures, for max_duration 1m and 6h:
1. `FileChannel.prepare` (one node, log interval 0.5 s as the local provider uses) and its manifest size;
2. wall time of `gpucloud run` of a job `run: "true"` on the local provider, median of --runs.

Usage: python bench/bench_max_duration.py [--runs 5]. Uses a throwaway GPUCLOUD_HOME.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from local_runs import run_walls, throwaway_home  # noqa: E402

from gpucloud.channel.run_objects import FileChannel  # noqa: E402

JOB = """name: bench-true-{label}
resources: {{cloud: local}}
run: "true"
max_duration: {duration}
"""
DURATIONS = {"1m": timedelta(minutes=1), "6h": timedelta(hours=6)}


def prepare_cost(root: Path, duration: timedelta) -> tuple[float, int]:
    channel = FileChannel(root)
    times = []
    for i in range(5):
        t0 = time.perf_counter()
        url = channel.prepare(f"bench-{duration.seconds}-{i}", 1, datetime.now(UTC) + duration)[0]
        times.append(time.perf_counter() - t0)
    return statistics.median(times), Path(url.removeprefix("file://")).stat().st_size


def run_cost(jobs: Path, label: str, env: dict[str, str], runs: int) -> float:
    job = jobs / f"{label}.yaml"
    job.write_text(JOB.format(label=label.lower(), duration=label))
    return statistics.median(run_walls(job, env, runs))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with throwaway_home() as (jobs, env):
        root = jobs.parent
        print("| max_duration | FileChannel.prepare | manifest | `gpucloud run` of `true` (median) |")
        print("|---|---|---|---|")
        for label, duration in DURATIONS.items():
            prep, size = prepare_cost(root / f"channel-{label}", duration)
            wall = run_cost(jobs, label, env, args.runs)
            print(f"| {label} | {prep * 1000:.1f} ms | {size} bytes | {wall:.2f} s |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
