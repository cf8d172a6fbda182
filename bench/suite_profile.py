"""Where the test suite's time and CPU go, per folder, file and test.

Run the suite with GPUCLOUD_TEST_CPU=PREFIX (tests/support/cpu_profile.py writes one JSON line per
test to PREFIX.<worker>), then read it back:

    GPUCLOUD_TEST_CPU=/tmp/cpu python -m pytest -q -n 4
    python bench/suite_profile.py /tmp/cpu [--top 30] [--write tests/scope_costs.json]

--write keeps each file's worker seconds for tests/conftest.py, which hands the longest files out
first (best written from a run on an otherwise idle machine).

CPU is the worker's own plus what its reaped children used while the test ran; a machine shared with
other work inflates wall time, not CPU, so compare CPU between runs and wall only on an idle machine.
"""

from __future__ import annotations

import argparse
import glob
import json
import re
from collections import defaultdict
from collections.abc import Iterable


def load(prefix: str) -> list[dict[str, float | str]]:
    """The rows of PREFIX.main and PREFIX.gw<N> only: a PREFIX.log beside them is not the profile's."""
    rows: list[dict[str, float | str]] = []
    paths = [p for p in glob.glob(f"{prefix}.*") if re.fullmatch(r"gw\d+|main", p.rsplit(".", 1)[1])]
    for path in sorted(paths):
        with open(path) as lines:
            rows.extend(json.loads(line) for line in lines if line.strip())
    return rows


def totals(rows: Iterable[dict[str, float | str]], key: str) -> list[tuple[str, int, float, float]]:
    """(group, tests, wall, cpu) per group, the most CPU first; key is "dir", "file" or "test"."""
    acc: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for row in rows:
        test = str(row["id"])
        file = test.split("::", 1)[0]
        group = {"dir": file.rsplit("/", 1)[0], "file": file, "test": test}[key]
        slot = acc[group]
        slot[0] += 1
        slot[1] += float(row["wall"])
        slot[2] += float(row["own"]) + float(row["kids"])
    out = [(group, int(n), wall, cpu) for group, (n, wall, cpu) in acc.items()]
    return sorted(out, key=lambda t: -t[3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefix", help="the GPUCLOUD_TEST_CPU prefix the suite ran with")
    parser.add_argument("--top", type=int, default=25, help="files and tests listed (default 25)")
    parser.add_argument("--write", metavar="JSON", help="write each file's worker seconds here")
    args = parser.parse_args()
    rows = load(args.prefix)
    if args.write:
        costs = {file: round(wall, 1) for file, _, wall, _ in sorted(totals(rows, "file"))}
        with open(args.write, "w") as out:
            json.dump(costs, out, indent=0, sort_keys=True)
            out.write("\n")
    wall = sum(float(r["wall"]) for r in rows)
    cpu = sum(float(r["own"]) + float(r["kids"]) for r in rows)
    print(f"{len(rows)} tests: {wall:,.0f} worker-s wall, {cpu:,.0f} CPU-s")
    for key, limit in (("dir", 1000), ("file", args.top), ("test", args.top)):
        print(f"\n| {key} | tests | wall s | CPU s | CPU share |\n|---|---|---|---|---|")
        for group, n, group_wall, group_cpu in totals(rows, key)[:limit]:
            print(f"| {group} | {n} | {group_wall:,.1f} | {group_cpu:,.1f} | {100 * group_cpu / max(cpu, 1e-9):.1f}% |")


if __name__ == "__main__":
    main()
