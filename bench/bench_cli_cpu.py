"""CLI start-up by CPU time (user + sys of the child), which a loaded machine disturbs far less
than wall time: medians of N runs of `--help`, `version` and two `plan`s, for this checkout and,
optionally, another source tree (e.g. an older commit unpacked with `git archive REV | tar -x -C DIR`),
interleaved so both see the same load.

Run: python bench/bench_cli_cpu.py [--runs 9] [--against DIR]   (from the repo root)
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CASES = {
    "gpucloud --help": ["--help"],
    "gpucloud version": ["version"],
    "gpucloud plan examples/t4-any-cloud.yaml": ["plan", "examples/t4-any-cloud.yaml"],
    "gpucloud plan --json examples/a100-azure.yaml": ["plan", "--json", "examples/a100-azure.yaml"],
}


def cpu_seconds(args: list[str], tree: Path) -> float:
    """CPU seconds of one `python -m gpucloud ARGS` run with `tree` first on the import path."""
    env = {**os.environ, "PYTHONPATH": str(tree), "CI": "true"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [sys.executable, "-m", "gpucloud", *args],
        cwd=tree,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--against", type=Path, help="another source tree to compare with")
    opts = parser.parse_args()
    trees = {"this": REPO, **({"other": opts.against.resolve()} if opts.against else {})}
    print(f"{'command':44s} " + " ".join(f"{name:>8s}" for name in trees) + f"  (median CPU s, runs={opts.runs})")
    for label, args in CASES.items():
        times: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(opts.runs + 1):  # the first round warms caches and .pyc files; not counted
            for name, tree in trees.items():
                times[name].append(cpu_seconds(args, tree))
        print(f"{label:44s} " + " ".join(f"{statistics.median(t[1:]):8.3f}" for t in times.values()))


if __name__ == "__main__":
    main()
