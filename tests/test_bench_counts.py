"""The plan benchmarks still measure what BENCHMARKS.md says it measured: the candidate and exclusion
counts written beside each figure are what bench/bench_plan_rows.py computes for that shape, job
and size. The counting part runs on one to three replicas of the shipped rows (the grown catalog is
replicas of them, so each count is affine in the number of replicas: checked here), and is
extrapolated to the size written in the table; the timing part is not run."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from bench_plan_alternatives import counts as alternatives_counts  # noqa: E402
from bench_plan_rows import JOBS, SHAPES, counts  # noqa: E402

SECTION = "## plan over a grown catalog"


def written_counts() -> list[tuple[str, str, int, int, int]]:
    """(shape, job, rows, candidates, exclusions) from the section's table."""
    text = (REPO / "BENCHMARKS.md").read_text()
    assert SECTION in text, f"BENCHMARKS.md has no {SECTION!r} section"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    out = []
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0] in SHAPES:
            rows, cand, excl = (int(re.sub(r"[,\s]", "", c)) for c in cells[2:5])
            out.append((cells[0], cells[1], rows, cand, excl))
    return out


def test_the_table_covers_every_shape_and_job() -> None:
    assert {(shape, job) for shape, job, *_ in written_counts()} == {(s, j) for s in SHAPES for j in JOBS}


@pytest.mark.parametrize("row", written_counts(), ids=lambda r: f"{r[0]}-{r[1]}")
def test_written_counts_are_what_the_bench_computes(row: tuple[str, str, int, int, int], tmp_path: Path) -> None:
    shape, job, rows, cand, excl = row
    one, two, three = (counts(k, shape, job, tmp_path) for k in (1, 2, 3))
    step = tuple(b - a for a, b in zip(one, two, strict=True))
    assert tuple(c - b for b, c in zip(two, three, strict=True)) == step, "counts are not affine in the replicas"
    assert rows % one[0] == 0, f"{rows} rows is not a whole number of replicas of {one[0]}"
    replicas = rows // one[0]
    expected = tuple(first + (replicas - 1) * d for first, d in zip(one, step, strict=True))
    assert (rows, cand, excl) == expected, (
        f"BENCHMARKS.md says {shape}/{job}: {rows:,} rows, {cand:,} candidates, {excl:,} exclusions; "
        f"bench/bench_plan_rows.py computes {expected[0]:,} / {expected[1]:,} / {expected[2]:,}. "
        "Rerun the bench and update the table."
    )


ALTERNATIVES = "## plan with GPU alternatives and ranges"


def written_alternatives() -> list[tuple[bool, str, int, int, int]]:
    """(every region?, shape, rows, candidates, exclusions) from the alternatives section's table."""
    text = (REPO / "BENCHMARKS.md").read_text()
    assert ALTERNATIVES in text, f"BENCHMARKS.md has no {ALTERNATIVES!r} section"
    section = text.split(ALTERNATIVES, 1)[1].split("\n## ", 1)[0]
    out = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0].startswith("3 requests"):
            rows, cand, excl = (int(re.sub(r"[,\s]", "", c)) for c in cells[1:4])
            shape = "types" if "types shape" in cells[0] else "regions"
            out.append(("every region" in cells[0], shape, rows, cand, excl))
    return out


def test_the_alternatives_table_has_both_jobs() -> None:
    assert {(every, shape) for every, shape, *_ in written_alternatives()} == {
        (False, "regions"),
        (True, "regions"),
        (False, "types"),
    }


@pytest.mark.parametrize(
    "row", written_alternatives(), ids=lambda r: f"{'every-region' if r[0] else 'three-regions'}-{r[1]}-{r[2]}"
)
def test_written_alternatives_counts_are_what_the_bench_computes(
    row: tuple[bool, str, int, int, int], tmp_path: Path
) -> None:
    every, shape, rows, cand, excl = row
    one, two, three = (alternatives_counts(k, every, tmp_path, shape) for k in (1, 2, 3))
    step = tuple(b - a for a, b in zip(one, two, strict=True))
    assert tuple(c - b for b, c in zip(two, three, strict=True)) == step, "counts are not affine in the replicas"
    assert rows % one[0] == 0, f"{rows} rows is not a whole number of replicas of {one[0]}"
    expected = tuple(first + (rows // one[0] - 1) * d for first, d in zip(one, step, strict=True))
    assert (rows, cand, excl) == expected, (
        f"BENCHMARKS.md says {rows:,} rows, {cand:,} candidates, {excl:,} exclusions; "
        f"bench/bench_plan_alternatives.py computes {expected[0]:,} / {expected[1]:,} / {expected[2]:,}. "
        "Rerun the bench and update the table."
    )
