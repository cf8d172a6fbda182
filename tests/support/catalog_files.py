"""A catalog as a test needs it twice: written as the refresh writes it and opened (the indexed
file), and the same rows in memory; and the benchmark's catalog grower (bench/bench_plan_rows.py)."""

from __future__ import annotations

import dataclasses
import functools
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gpucloud.catalog import forget_refreshed, load_catalog, offerings_db, shipped_catalog
from gpucloud.catalog.rows import MemoryRows
from gpucloud.spec.load import load_spec

if TYPE_CHECKING:
    from gpucloud.catalog import Catalog
    from gpucloud.catalog.models import Offering
    from gpucloud.spec.load import JobSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_plan_rows  # noqa: E402

__all__ = ["file_and_memory", "grown_rows", "written"]


@functools.cache
def _grown(replicas: int, shape: str) -> tuple[Offering, ...]:
    return tuple(bench_plan_rows.grown_rows(replicas, shape))


def grown_rows(replicas: int, shape: str) -> list[Offering]:
    """The benchmark's grown catalog, built once per process for each size and shape (a dozen
    replicas of the shipped rows is ~0.1 s of `_replace`, asked for by a hundred tests); each
    call gets its own list, so a test may change its copy."""
    return list(_grown(replicas, shape))


# rows -> a pristine copy of the file offerings_db.write made of them: writing and indexing a grown catalog
# costs about a second, and many tests plan over the same rows, so each later test gets a copy.
_WRITTEN: dict[tuple[Offering, ...], Path] = {}


def written(rows: list[Offering], tmp_path: Path) -> None:
    """The rows written to this test's catalog file as the refresh writes them (the test's own copy:
    it may change it), and the loaded catalog forgotten."""
    target = offerings_db.cache_file()
    key = tuple(rows)
    pristine = _WRITTEN.get(key)
    if pristine is None or not pristine.exists():
        offerings_db.write(target, rows, created_at="2026-12-04T00:00:00Z", clouds={})
        pristine = tmp_path / f"written-{len(_WRITTEN)}.sqlite"
        shutil.copyfile(target, pristine)
        _WRITTEN[key] = pristine
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pristine, target)
    forget_refreshed()


def file_and_memory(rows: list[Offering], job: str, tmp_path: Path) -> tuple[Catalog, Catalog, JobSpec]:
    """The rows written as the refresh writes them and opened (the indexed file), the same rows in
    memory, and the job file `job` loaded."""
    written(rows, tmp_path)
    indexed = load_catalog()
    memory = dataclasses.replace(shipped_catalog(), rows=MemoryRows(rows), meta=indexed.meta)
    path = tmp_path / "job.yaml"
    path.write_text(job)
    return indexed, memory, load_spec(path)
