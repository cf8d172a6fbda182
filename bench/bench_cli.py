"""CLI start-up and planning speed: medians of N runs of `gpucloud --help`, `gpucloud version` and
`gpucloud plan examples/t4-any-cloud.yaml`, plus a check that --help/version import no cloud SDK.

Run: python bench/bench_cli.py [--runs 9]   (from the repo root, with gpucloud installed)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def median_wall(cmd: list[str], runs: int) -> float:
    env = {**os.environ, "CI": "true"}
    times = []
    for _ in range(runs + 1):  # the first run warms the page cache and .pyc files; not counted
        start = time.perf_counter()
        subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def sdk_modules_imported(args: list[str]) -> list[str]:
    code = (
        "import sys; sys.argv = ['gpucloud', *sys.argv[1:]]\n"
        "from gpucloud.cli import app\n"
        "try:\n    app()\nexcept SystemExit:\n    pass\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'boto3', 'botocore', 'azure'})\n"
        "print(','.join(bad), file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True)
    return [m for m in out.stderr.strip().splitlines()[-1].split(",") if m] if out.stderr.strip() else []


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    exe = shutil.which("gpucloud")
    if exe is None:
        sys.exit("gpucloud is not on PATH: pip install . first")
    rows = [
        ("gpucloud --help", [exe, "--help"], 0.25),
        ("gpucloud version", [exe, "version"], 0.20),
        ("gpucloud plan examples/t4-any-cloud.yaml", [exe, "plan", "examples/t4-any-cloud.yaml"], 0.60),
        ("gpucloud plan --json examples/a100-azure.yaml", [exe, "plan", "--json", "examples/a100-azure.yaml"], 0.60),
    ]
    print(f"{'command':45} {'median s':>9} {'target':>7}  runs={args.runs}")
    for label, cmd, target in rows:
        m = median_wall(cmd, args.runs)
        print(f"{label:45} {m:9.3f} {target:7.2f}  {'ok' if m <= target else 'OVER'}")
    for argv in (["--help"], ["version"]):
        mods = sdk_modules_imported(argv)
        print(f"cloud SDK modules imported by `gpucloud {' '.join(argv)}`: {len(mods)}")


if __name__ == "__main__":
    main()
