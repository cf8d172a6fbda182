"""bench/bench_state_concurrency.py, small: concurrent CLI processes starting and ending runs
against one store lose no update, on both backends (the 50-process figures are in BENCHMARKS.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_state_concurrency import one_round  # noqa: E402


@pytest.mark.usefixtures("backend", "gpucloud_home")
def test_concurrent_clis_lose_no_update() -> None:
    figures = one_round(dict(os.environ), procs=8, runs=2)
    assert figures["errors"] == [] and not any(figures["lost"].values()), figures  # type: ignore[union-attr]
