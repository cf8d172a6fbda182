"""Overhead of `gpucloud run` on the local provider (targets from the local-run issue):

1. wall time of `gpucloud run` for a job `run: "true"`, paired with `python -c pass` (bench/paired.py:
   bytecode compiled first, min/median/max, ratio, CPU time, load average; target <= 2 s);
2. latency from a line printed by the job to that line on the CLI's stdout (target <= 2 s).

Usage: python bench/bench_run.py [--runs 5]. Uses a throwaway GPUCLOUD_HOME; prints the figures.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from local_runs import throwaway_home
from paired import compile_package, gpucloud_cmd, load_text, run_paired

TRUE_JOB = """name: bench-true
resources: {cloud: local}
run: "true"
max_duration: 10m
"""

# The job prints wall-clock stamps 1.7 s apart (not aligned with the 1 s log interval), then ends.
LATENCY_JOB = """name: bench-latency
resources: {cloud: local}
run: python -c 'import time; [print("STAMP", time.time(), flush=True) or time.sleep(1.7) for _ in range(5)]'
max_duration: 10m
"""


def cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpucloud", *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    compile_package()
    with throwaway_home() as (jobs, env):
        (jobs / "true.yaml").write_text(TRUE_JOB)
        (jobs / "latency.yaml").write_text(LATENCY_JOB)

        command = gpucloud_cmd("run", str(jobs / "true.yaml"), "--cloud", "local")
        walls = run_paired("gpucloud run (job `true`, local provider)", command, args.runs, env, cwd=jobs)

        lags = []
        proc = cli(["run", str(jobs / "latency.yaml"), "--cloud", "local"], jobs, env)
        assert proc.stdout is not None
        for raw in proc.stdout:
            seen = time.time()
            parts = raw.decode(errors="replace").split()
            if len(parts) == 2 and parts[0] == "STAMP":
                lags.append(seen - float(parts[1]))
        proc.wait()

    print(walls.line(2.0) + f"  [{load_text()}]")
    if lags:
        print(
            f"job line -> CLI stdout latency: median {statistics.median(lags):.2f} s, max {max(lags):.2f} s "
            f"over {len(lags)} lines; target <= 2 s"
        )
    else:
        print("job line -> CLI stdout latency: no line arrived", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
