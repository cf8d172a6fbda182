"""A catalog as a test needs it twice: written as the refresh writes it and opened (the indexed
file), and the same rows in memory; and the benchmark's catalog grower (bench/bench_plan_rows.py)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gpucloud.catalog import load_catalog, shipped_catalog, store
from gpucloud.catalog.rows import MemoryRows
from gpucloud.spec.load import load_spec

if TYPE_CHECKING:
    from gpucloud.catalog import Catalog
    from gpucloud.catalog.models import Offering
    from gpucloud.spec.load import JobSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from bench_plan_rows import grown_rows  # noqa: E402

__all__ = ["file_and_memory", "grown_rows"]


def file_and_memory(rows: list[Offering], job: str, tmp_path: Path) -> tuple[Catalog, Catalog, JobSpec]:
    """The rows written as the refresh writes them and opened (the indexed file), the same rows in
    memory, and the job file `job` loaded."""
    store.write(store.cache_file(), rows, created_at="2026-12-04T00:00:00Z", clouds={})
    load_catalog.cache_clear()  # type: ignore[attr-defined]
    indexed = load_catalog()
    memory = dataclasses.replace(shipped_catalog(), rows=MemoryRows(rows), meta=indexed.meta)
    path = tmp_path / "job.yaml"
    path.write_text(job)
    return indexed, memory, load_spec(path)
