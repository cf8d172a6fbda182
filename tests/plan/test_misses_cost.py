"""An empty plan's explanation reads the catalog a bounded number of times, however many offerings
were excluded: the closest misses once looked up each exclusion's GPU and price by a scan of the
whole table (thousands of exclusions times thousands of rows for a job nothing fits)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gpucloud.catalog import load_catalog
from gpucloud.errors import UserError
from gpucloud.plan.planner import make_plan
from tests.support.planner_oracle import job


class _CountingRows:
    """The catalog's row source, counting reads of the whole table."""

    def __init__(self, rows: Any) -> None:
        self.inner, self.whole_reads = rows, 0

    def all(self) -> Any:
        self.whole_reads += 1
        return self.inner.all()

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_closest_misses_read_the_whole_catalog_a_bounded_number_of_times() -> None:
    cat = load_catalog()
    rows = _CountingRows(cat.rows)
    counted = dataclasses.replace(cat, rows=rows)
    with pytest.raises(UserError) as info:
        make_plan(job(gpu="A100-80GB:1", max_price_per_hour=0.5), catalog=counted)
    text = info.value.render()
    assert "Closest misses" in text and "Standard_NC24ads_A100_v4" in text
    assert rows.whole_reads <= 5, f"{rows.whole_reads} reads of the whole catalog for one empty plan"
