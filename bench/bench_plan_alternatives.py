"""`plan` with GPU alternatives and ranges over a 50k-row refreshed catalog.

The job asks for any of three requests, two of them ranged (`{memory: 24GB.., count: 1..2}`,
`A100|H100:1..8`, `T4:1`) across both clouds in three named regions (as bench_plan_rows.py's
family job); `--every-region` drops the regions: then the candidates grow with the catalog (tens of
thousands), and building them is the planner's known cost (BENCHMARKS.md, "plan over a grown
catalog"). Catalog = the shipped rows replicated into ~50k rows by renaming regions (the refresh's own
store code writes the indexed SQLite file into a temporary GPUCLOUD_HOME, bench_plan_rows.py).

Measured: `make_plan` in-process with the catalog opened cold each sample (the planner's work on
those rows: matching, pricing, images, sorting), and `python -m gpucloud plan JOB` paired with
`python -c pass` (bench/paired.py), whose difference is start-up + plan + printing.

Run: python bench/bench_plan_alternatives.py [--rows 50000] [--runs 9] [--every-region] [--shape regions|types]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_plan_rows import SHAPES, grown_rows, replicas_for  # noqa: E402
from paired import compile_package, gpucloud_cmd, load_text, run_paired  # noqa: E402

JOB = """\
name: alternatives
resources:
  cloud: [aws, azure]
  regions: [us-east-1, us-west-2, eastus]
  gpu:
    - {memory: 24GB.., count: 1..2}
    - A100|H100:1..8
    - T4:1
  spot: auto
run: "true"
max_duration: 2h
"""


def job_text(every_region: bool) -> str:
    return JOB.replace("  regions: [us-east-1, us-west-2, eastus]\n", "") if every_region else JOB


def counts(replicas: int, every_region: bool, folder: Path, shape: str = "regions") -> tuple[int, int, int]:
    """(rows, candidates, exclusions) of the job over `replicas` replicas of the shipped rows, planned
    in memory: the counting part of the bench (tests/test_bench_counts.py holds BENCHMARKS.md to it)."""
    import dataclasses

    from gpucloud.catalog import shipped_catalog
    from gpucloud.catalog.rows import MemoryRows
    from gpucloud.plan.planner import make_plan
    from gpucloud.spec.load import load_spec

    rows = grown_rows(replicas, shape)
    job = folder / "alternatives.yaml"
    job.write_text(job_text(every_region))
    plan = make_plan(load_spec(job), catalog=dataclasses.replace(shipped_catalog(), rows=MemoryRows(rows)), baked=False)
    return len(rows), len(plan.candidates), len(plan.excluded)


def plan_ms(job: Path, samples: int) -> tuple[list[float], int, int]:
    from gpucloud.catalog import load_catalog
    from gpucloud.plan.planner import make_plan
    from gpucloud.spec.load import load_spec

    spec = load_spec(job)
    out = []
    plan = None
    for _ in range(samples):
        load_catalog.cache_clear()  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        plan = make_plan(spec, baked=False)
        out.append((time.perf_counter() - t0) * 1000)
    assert plan is not None
    return out, len(plan.candidates), len(plan.excluded)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--every-region", action="store_true")
    parser.add_argument("--shape", choices=SHAPES, default="regions")
    args = parser.parse_args()
    compile_package()
    from gpucloud.catalog import load_catalog, offerings_db

    folder = Path(tempfile.mkdtemp(prefix="gpucloud-bench-alt-"))
    os.environ["GPUCLOUD_HOME"] = str(folder / "home")
    load_catalog.cache_clear()  # type: ignore[attr-defined]
    rows = grown_rows(replicas_for(args.rows), args.shape)
    offerings_db.write(offerings_db.cache_file(), rows, created_at="2026-12-04T00:00:00Z", clouds={})
    job = folder / "jobs" / "alternatives.yaml"  # not beside GPUCLOUD_HOME: a workdir holding it is refused
    job.parent.mkdir()
    job.write_text(job_text(args.every_region))
    ms, candidates, excluded = plan_ms(job, args.runs)
    counted = f"{candidates:,} candidates, {excluded:,} exclusions"
    print(f"{len(rows):,} rows ({args.shape}); 3 requests (2 ranged): {counted}")
    print(
        f"  make_plan in-process (catalog opened cold): min {min(ms):.1f} / median {statistics.median(ms):.1f} / "
        f"max {max(ms):.1f} ms (budget 300 ms)  [{load_text()}]"
    )
    paired = run_paired(
        "  plan alternatives.yaml", gpucloud_cmd("plan", str(job)), args.runs, {"GPUCLOUD_HOME": str(folder / "home")}
    )
    print(paired.line(0.30) + f"  [{load_text()}]")
    # The same command on the shipped catalog (157 rows): what start-up and imports cost here now.
    base = run_paired(
        "  plan alternatives.yaml, shipped catalog",
        gpucloud_cmd("plan", str(job)),
        args.runs,
        {"GPUCLOUD_HOME": str(folder / "empty")},
    )
    print(base.line(0.30) + f"  [{load_text()}]")


if __name__ == "__main__":
    main()
