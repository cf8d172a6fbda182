"""`plan` over a generated 50k-row refreshed catalog (issue 12: under 0.3 s median).

Builds 50,000 offerings (the shipped rows replicated over synthetic regions), writes them with the
same store code `catalog refresh` uses into a temporary GPUCLOUD_HOME, then times, per sample, a
cold load of the cache plus `make_plan` for a T4:1 job over every region (the work a fresh
`gpucloud plan` does after import). Usage: python bench/bench_plan_50k.py [N]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["GPUCLOUD_HOME"] = tempfile.mkdtemp(prefix="gpucloud-bench-")

from gpucloud.catalog import load_catalog, shipped_catalog, store  # noqa: E402
from gpucloud.planner import make_plan  # noqa: E402
from gpucloud.spec import GpuRequest, JobSpec, Resources  # noqa: E402

ROWS = 50_000


def build() -> None:
    base = [o for o in shipped_catalog().offerings]
    rows = []
    i = 0
    while len(rows) < ROWS:
        for o in base:
            rows.append(
                o._replace(region=f"{o.region}-x{i}", price_per_hour=round(o.price_per_hour * (1 + i / 1000), 4))
            )
        i += 1
    store.write(store.cache_file(), rows[:ROWS], created_at="2026-12-03T00:00:00Z", clouds={})


def main(n: int = 20) -> None:
    build()
    spec = JobSpec(name="b", resources=Resources(gpu=GpuRequest(model="T4", count=1), spot="auto"), run="true")
    times = []
    for _ in range(n):
        load_catalog.cache_clear()
        t0 = time.perf_counter()
        plan = make_plan(spec)
        times.append(time.perf_counter() - t0)
    print(
        f"{len(load_catalog().offerings)} offerings; {len(plan.candidates)} candidates, {len(plan.excluded)} excluded"
    )
    print(
        f"load cache + plan  median {statistics.median(times) * 1000:.0f} ms  max {max(times) * 1000:.0f} ms "
        f"({n} samples; budget 300 ms)"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
