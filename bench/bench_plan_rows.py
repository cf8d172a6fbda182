"""`plan` over a grown catalog: the shipped offerings replicated into ~200k rows (or --rows), written
by the refresh's own store code (an indexed SQLite file) into a temporary GPUCLOUD_HOME.

Two growth shapes: `regions` (each replica renames every row's region: many regions, the same
types) and `types` (each replica renames every row's instance type: many types in the same
regions). For each shape and job it prints the candidate and exclusion counts (what is being
measured: tests/test_bench_counts.py checks that the counts in BENCHMARKS.md are what this script
computes), the catalog time in-process (open the file + read the job's rows through the index),
and the wall time of `python -m gpucloud plan JOB` paired with `python -c pass` (bench/paired.py).

Run: python bench/bench_plan_rows.py [--rows 200000] [--runs 7] [--shape regions|types]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired import REPO, compile_package, gpucloud_cmd, load_text, run_paired  # noqa: E402

SHAPES = ("regions", "types")
# The examples, and a request with alternatives: the A100 family (40 GB and 80 GB variants), eight
# per node, in three named regions of two clouds, with vCPU and memory minimums.
FAMILY_JOB = """\
name: a100-family
resources:
  cloud: [aws, azure]
  regions: [us-east-1, us-west-2, eastus]
  gpu: A100:8
  spot: auto
  min_vcpus: 64
  min_memory_gib: 512
run: "true"
max_duration: 2h
"""
JOBS = ("examples/t4-any-cloud.yaml", "examples/a100-azure.yaml", "a100-family.yaml")


def job_path(name: str, folder: Path) -> Path:
    if name == "a100-family.yaml":
        path = folder / "jobs" / name  # not beside the GPUCLOUD_HOME made in `folder`: a workdir holding it is refused
        path.parent.mkdir(exist_ok=True)
        path.write_text(FAMILY_JOB)
        return path
    return REPO / name


def grown_rows(replicas: int, shape: str) -> list:
    """The shipped rows `replicas` times; replica 0 is the shipped rows themselves."""
    from gpucloud.catalog import shipped_catalog

    base = shipped_catalog().offerings
    rows = list(base)
    for i in range(1, replicas):
        if shape == "regions":
            rows.extend(o._replace(region=f"{o.region}-r{i}") for o in base)
        else:
            rows.extend(o._replace(instance_type=f"{o.instance_type}-t{i}") for o in base)
    return rows


def replicas_for(rows: int) -> int:
    from gpucloud.catalog import shipped_catalog

    return max(1, rows // len(shipped_catalog().offerings))


def counts(replicas: int, shape: str, job: str, folder: Path) -> tuple[int, int, int]:
    """(rows, candidates, exclusions) of `plan JOB` over the grown catalog, planned in memory:
    the counting part of the bench, without the file or the timing."""
    from gpucloud.catalog import shipped_catalog
    from gpucloud.catalog.rows import MemoryRows
    from gpucloud.plan.planner import make_plan
    from gpucloud.spec.load import load_spec

    rows = grown_rows(replicas, shape)
    cat = dataclasses.replace(shipped_catalog(), rows=MemoryRows(rows))
    plan = make_plan(load_spec(job_path(job, folder)), catalog=cat, baked=False)
    return len(rows), len(plan.candidates), len(plan.excluded)


def catalog_ms(spec_path: Path, samples: int) -> list[float]:
    """Open the catalog file and read what `plan` reads for the job (planner.read_rows: the counts,
    the rows that are exclusions, and the cheapest candidates of each market), `samples` times
    (cold: the per-process cache is cleared each time)."""
    from gpucloud.catalog import load_catalog
    from gpucloud.contract import registry as providers
    from gpucloud.plan.planner import _allowed_regions, _requested_gpu, read_rows
    from gpucloud.plan.rows import HEAD, QuickReasons
    from gpucloud.spec.load import load_spec

    spec = load_spec(spec_path)
    out = []
    for _ in range(samples):
        load_catalog.cache_clear()  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        cat = load_catalog()
        clouds = [c for c in spec.resources.cloud if providers.info(c).priced]
        gpu = _requested_gpu(spec, cat)
        variants = frozenset(cat.members(gpu)) if gpu else frozenset()
        quick = QuickReasons(spec, gpu, variants, clouds, _allowed_regions(spec, None, clouds, cat))
        part, _, _ = read_rows(cat, quick, spec, spec.resources.spot)
        if part is not None:
            part.head(HEAD)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def bench_shape(shape: str, replicas: int, runs: int, folder: Path) -> None:
    from gpucloud.catalog import load_catalog, offerings_db

    home = folder / f"home-{shape}"
    os.environ["GPUCLOUD_HOME"] = str(home)
    load_catalog.cache_clear()  # type: ignore[attr-defined]
    rows = grown_rows(replicas, shape)
    offerings_db.write(offerings_db.cache_file(), rows, created_at="2026-12-04T00:00:00Z", clouds={})
    print(f"\n== shape {shape}: {len(rows):,} rows ({replicas} replicas); {load_text()}")
    for job in JOBS:
        n, cand, excl = counts(replicas, shape, job, folder)
        cat = catalog_ms(job_path(job, folder), 9)
        print(f"{job}: {n:,} rows, {cand:,} candidates, {excl:,} exclusions")
        print(
            f"  catalog (open + the planner's reads): min {min(cat):.1f} / median {statistics.median(cat):.1f} / "
            f"max {max(cat):.1f} ms (budget 50 ms)"
        )
        paired = run_paired(
            f"  plan {job}", gpucloud_cmd("plan", str(job_path(job, folder))), runs, {"GPUCLOUD_HOME": str(home)}
        )
        print(paired.line(0.30) + f"  [{load_text()}]")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--shape", choices=SHAPES, action="append")
    args = parser.parse_args()
    compile_package()
    folder = Path(tempfile.mkdtemp(prefix="gpucloud-bench-"))
    for shape in args.shape or SHAPES:
        bench_shape(shape, replicas_for(args.rows), args.runs, folder)


if __name__ == "__main__":
    main()
