"""The indexed catalog file plans exactly as the same rows held in memory: the same candidates, the
same exclusions in the same order, and the printed plan's exclusion table, whichever rows the
planner read through the index and whichever it only counted, and whether the cheapest candidates
were read whole or found through the price indexes."""

from __future__ import annotations

import dataclasses
import io
import math
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from gpucloud.catalog import load_catalog, offerings_db, ranking, shipped_catalog
from gpucloud.catalog.models import Offering
from gpucloud.catalog.rows import RowFilter
from gpucloud.plan.planner import make_plan
from gpucloud.plan.rows import Exclusion, Exclusions, listed_exclusions
from gpucloud.spec.load import load_spec

if TYPE_CHECKING:
    pass

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from bench_plan_rows import FAMILY_JOB  # noqa: E402

from tests.support.catalog_files import file_and_memory, grown_rows, written

REPO = Path(__file__).resolve().parents[2]
JOBS = {
    "t4": (REPO / "examples/t4-any-cloud.yaml").read_text(),
    "a100-azure": (REPO / "examples/a100-azure.yaml").read_text(),
    "family": FAMILY_JOB,
    "fixed-type": "name: f\nresources:\n  cloud: [aws]\n  instance_type: g4dn.xlarge\nrun: 'true'\n",
    "minimums": "name: c\nresources:\n  cloud: [azure]\n  regions: [eastus]\n  gpu: T4\n  min_vcpus: 8\nrun: 'true'\n",
    "spot-capped": "name: s\nresources:\n  gpu: T4\n  spot: true\n  max_price_per_hour: 0.3\nrun: 'true'\n",
    "on-demand-nodes": "name: n\nresources:\n  gpu: A10G\n  max_price_per_hour: 1.1\nnum_nodes: 3\nrun: 'true'\n",
}
HIDDEN = ("has ", "cloud ", "instance type is not")


@pytest.fixture(autouse=True, params=["read-whole", "price-walk"])
def cheapest_by(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test twice: the cheapest candidates read whole and sorted (few rows give candidates, as
    in these small catalogs), and found by walking the price indexes (many rows: forced here)."""
    if request.param == "price-walk":
        monkeypatch.setattr(ranking, "WALK_ABOVE", 0)
    return str(request.param)


def _printed(plan: object) -> str:
    from gpucloud.ui import views

    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        views.print_plan(plan, show_all=False)  # type: ignore[arg-type]
    return out.getvalue()


@pytest.mark.parametrize("shape", ["regions", "types"])
@pytest.mark.parametrize("job", sorted(JOBS))
def test_the_index_plans_as_the_rows_in_memory(shape: str, job: str, tmp_path: Path) -> None:
    rows = grown_rows(4, shape)
    indexed, memory, spec = file_and_memory(rows, JOBS[job], tmp_path)
    assert indexed.meta.origin == "refreshed" and len(indexed.rows) == len(rows)

    from_index = make_plan(spec, catalog=indexed, baked=False)
    from_memory = make_plan(spec, catalog=memory, baked=False)
    assert isinstance(from_index.excluded, Exclusions)
    # the view's short list, read through the index before anything listed every exclusion
    short, relevant = listed_exclusions(from_index.excluded, HIDDEN, 8)
    printed = _printed(from_index)
    assert from_index.candidates == from_memory.candidates
    every = list(from_memory.excluded)
    assert list(from_index.excluded) == every and len(from_index.excluded) == len(every)
    candidate_rows = {(c.cloud, c.region, c.instance_type) for c in from_index.candidates}
    assert len(candidate_rows) + len(every) == len(rows)  # every row is a candidate or excluded, once
    assert every == _checked_one_by_one(spec, memory)
    expected = [e for e in every if not e.reason.startswith(HIDDEN)]
    assert (short, relevant) == (expected[:8], len(expected))
    assert printed == _printed(from_memory)


def _priced_options(off: Offering, spec: Any, policy: bool | str, request: str = "") -> tuple[list[Any], str | None]:
    """Candidates for one offering under the spot policy and max price, or why there are none: the
    planner's own market check and candidate, one row at a time."""
    from gpucloud.plan import planner

    markets, reason = planner._markets(off, policy, spec.price_cap())
    return [planner._candidate(off, is_spot, price, spec, None, request) for is_spot, price in markets], reason


def _checked_one_by_one(spec: object, cat: object) -> list[Exclusion]:
    """The exclusions of a check of every row by the planner's full check, in catalog order."""
    from gpucloud.contract import registry as providers
    from gpucloud.plan.planner import _exclusion_reason, _requested_gpu

    res = spec.resources  # type: ignore[attr-defined]
    clouds = [c for c in res.cloud if providers.info(c).priced]
    regions = set(res.regions) if res.regions else None
    gpu = _requested_gpu(spec, cat)  # type: ignore[arg-type]
    variants = frozenset(cat.members(gpu)) if gpu else frozenset()  # type: ignore[attr-defined]
    out = []
    for off in cat.offerings:  # type: ignore[attr-defined]
        reason = _exclusion_reason(off, spec, gpu, variants, clouds, regions)  # type: ignore[arg-type]
        if reason is None:
            reason = _priced_options(off, spec, res.spot)[1]  # type: ignore[arg-type]
        if reason is not None:
            out.append(Exclusion(off.cloud, off.region, off.instance_type, reason))
    return out


@pytest.mark.parametrize("shape", ["regions", "types"])
def test_candidates_are_ranked_as_a_full_sort_and_built_only_when_read(
    shape: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The printed plan of a job with tens of thousands of candidates builds only the ones it shows;
    reading further gives exactly the order of a sort of every candidate by the planner's key."""
    from gpucloud.plan import planner
    from gpucloud.plan.rows import HEAD
    from gpucloud.ui.views import PLAN_ROWS

    rows = grown_rows(40, shape)
    written(rows, tmp_path)
    path = tmp_path / "job.yaml"
    path.write_text(JOBS["t4"])
    spec = load_spec(path)
    built: list[object] = []
    real = planner._candidate

    def counting(*args: object) -> object:
        built.append(args[0])
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(planner, "_candidate", counting)
    plan = make_plan(spec, baked=False)
    _printed(plan)
    assert len(plan.candidates) > 900 and len(built) <= PLAN_ROWS

    fits = RowFilter(clouds=frozenset(("aws", "azure")), gpus=frozenset(("T4",)), gpu_count=1)
    every = [
        c
        for off in rows
        if fits.matches(off) and off.status != "retired"
        for c in _priced_options(off, spec, spec.resources.spot, spec.resources.gpu_requests[0].label())[0]
    ]
    every.sort(key=lambda c: (c.total_per_hour, c.status != "active", c.cloud, c.region, c.instance_type, c.spot))
    assert len(plan.candidates) == len(every)

    def bare(c: object) -> object:
        return dataclasses.replace(c, image=None)  # type: ignore[type-var]

    assert [bare(c) for c in plan.candidates[: HEAD - 1]] == every[: HEAD - 1]
    assert bare(plan.candidates[-1]) == every[-1] and bare(plan.candidates[HEAD + 5]) == every[HEAD + 5]
    assert [bare(c) for c in plan.candidates] == every
    assert all(c.image is not None for c in plan.candidates[:3])


def test_a_nan_price_survives_the_file() -> None:
    """SQLite stores a NaN as NULL; the file keeps it a NaN so the price check still refuses it."""
    t4 = shipped_catalog().offerings[0]
    rows = [t4, t4._replace(region="nanland", price_per_hour=math.nan, spot_price_per_hour=math.inf)]
    offerings_db.write(offerings_db.cache_file(), rows, created_at="2026-12-04T00:00:00Z", clouds={})
    load_catalog.cache_clear()  # type: ignore[attr-defined]
    back = load_catalog().rows.select(RowFilter(regions=frozenset({"nanland"})))
    assert len(back) == 1 and math.isnan(back[0][1].price_per_hour) and back[0][1].spot_price_per_hour == math.inf
    assert back[0][0] == 2 and back[0][1]._replace(price_per_hour=0.0) == rows[1]._replace(price_per_hour=0.0)


@pytest.mark.parametrize("job", ["t4", "spot-capped", "family"])
def test_odd_prices_in_the_file_plan_as_in_memory(job: str, tmp_path: Path) -> None:
    """Rows the file ranks itself must be exactly those the planner's check passes: NaN, infinite,
    tiny, integer and capped prices, retired and legacy rows are all decided as in memory."""
    rows = grown_rows(3, "regions")
    odd = []
    for i, o in enumerate(rows):
        kind = i % 9
        if kind == 1:
            o = o._replace(price_per_hour=math.nan)
        elif kind == 2:
            o = o._replace(spot_price_per_hour=math.inf)
        elif kind == 3:
            o = o._replace(spot_price_per_hour=1e-300)
        elif kind == 4:
            o = o._replace(price_per_hour=int(o.price_per_hour) + 1, spot_price_per_hour=None)
        elif kind == 5:
            o = o._replace(status="legacy")
        elif kind == 6:
            o = o._replace(status="retired")
        odd.append(o)
    indexed, memory, spec = file_and_memory(odd, JOBS[job], tmp_path)
    from_index = make_plan(spec, catalog=indexed, baked=False)
    from_memory = make_plan(spec, catalog=memory, baked=False)
    assert from_index.candidates[:5] == from_memory.candidates[:5]
    assert from_index.warnings == from_memory.warnings
    assert list(from_index.candidates) == list(from_memory.candidates)
    assert list(from_index.excluded) == list(from_memory.excluded)


def test_a_cache_of_another_format_is_ignored_with_a_reason() -> None:
    path = offerings_db.cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not a database at all" * 100)
    load_catalog.cache_clear()  # type: ignore[attr-defined]
    cat = load_catalog()
    assert cat.meta.origin == "shipped" and "unreadable" in cat.meta.note
    assert len(cat.offerings) == len(shipped_catalog().offerings)


WIDE_JOBS = {
    "alternatives": "name: a\nresources:\n  gpu: [A10G:1..4, T4:1]\n  spot: auto\nrun: 'true'\n",
    "ordered": "name: o\nresources:\n  gpu: [A10G:1, T4:1..4]\n  gpu_order: ordered\n  spot: auto\nrun: 'true'\n",
    "ordered-spot": (
        "name: s\nresources:\n  gpu: [L4:1, {memory: 20GB.., count: 1..2}, T4:1]\n  gpu_order: ordered\n"
        "  spot: true\n  min_vcpus: 8\nrun: 'true'\n"
    ),
    "memory-range": (
        "name: m\nresources:\n  gpu: [{memory: 24GB.., count: 1..2}, T4:1]\n  max_price_per_hour: 3.0\nrun: 'true'\n"
    ),
    "model-choice": "name: c\nresources:\n  gpu: A100|H100:8\n  spot: auto\nrun: 'true'\n",
    "pins": (
        "name: p\nresources:\n  cloud: [aws, azure]\n  gpu: [H100:1..8, T4:1]\nstack:\n  driver: '470'\nrun: 'true'\n"
    ),
}


@pytest.mark.parametrize("estimates", [True, False])
@pytest.mark.parametrize("shape", ["regions", "types"])
@pytest.mark.parametrize("job", sorted(WIDE_JOBS))
def test_gpu_alternatives_plan_through_the_file_as_in_memory(
    job: str, shape: str, estimates: bool, tmp_path: Path
) -> None:
    """GPU alternatives, ranges, `gpu_order: ordered`, per-GPU stack pins and --no-estimates: the
    file's own counting and ranking gives the same candidates (request, order, price source), the
    same exclusions and the same stacks as the rows in memory; the first few read before the rest."""
    from gpucloud.ui.views import PLAN_ROWS

    rows = grown_rows(12, shape)
    indexed, memory, spec = file_and_memory(rows, WIDE_JOBS[job], tmp_path)

    from_memory = make_plan(spec, catalog=memory, baked=False, estimates=estimates)
    head = make_plan(spec, catalog=indexed, baked=False, estimates=estimates)
    assert head.requests() == from_memory.requests()
    assert head.candidates[:PLAN_ROWS] == from_memory.candidates[:PLAN_ROWS]  # ranked without the rest
    assert _printed(head) == _printed(from_memory)
    assert head.stacks.keys() == from_memory.stacks.keys() and head.stack == from_memory.stack
    from_index = make_plan(spec, catalog=indexed, baked=False, estimates=estimates)
    assert len(from_index.candidates) == len(from_memory.candidates) > 2 * 32
    assert from_index.candidates == from_memory.candidates
    assert list(from_index.excluded) == list(from_memory.excluded)
    assert len(from_index.excluded) == len(from_memory.excluded)
    if not estimates:
        assert all(c.price_source is not None and c.price_source.kind != "estimate" for c in from_index.candidates)
    if job == "pins":
        assert any("stack pins do not fit the H100" in e.reason for e in from_index.excluded)
    if job.startswith("ordered"):
        ranks = [
            spec.resources.gpu_requests.index(next(r for r in spec.resources.gpu_requests if r.label() == c.request))
            for c in from_index.candidates
        ]
        assert ranks == sorted(ranks) and len(set(ranks)) > 1


@pytest.mark.parametrize("job", ["alternatives", "memory-range", "model-choice", "pins"])
def test_a_count_no_request_meets_is_counted_not_read_and_named_as_the_full_check_names_it(
    job: str, tmp_path: Path
) -> None:
    """A row of an asked-for GPU whose count meets no request (`has 8 × T4 per node, ...`) is a quick
    exclusion: the file counts it and never reads it for the plan, and listing the exclusions names
    it with GpuMatch.miss's words, in catalog order, from the file as from memory."""
    from gpucloud.plan.match import GpuMatch

    rows = grown_rows(3, "types")
    indexed, memory, spec = file_and_memory(rows, WIDE_JOBS[job], tmp_path)
    match = GpuMatch(spec, memory)
    clouds = set(spec.resources.cloud)
    expected = [
        Exclusion(o.cloud, o.region, o.instance_type, match.miss(o))
        for o in memory.offerings
        if o.cloud in clouds and o.gpu in match.variants and match.which(o) is None
    ]
    assert expected, "the catalog has rows of an asked-for GPU at a count no request takes"
    for cat in (indexed, memory):
        plan = make_plan(spec, catalog=cat, baked=False)
        assert isinstance(plan.excluded, Exclusions)
        assert not any(" per node, job asks for " in e.reason for _, e in plan.excluded._checked)  # not read
        assert [e for e in plan.excluded if " per node, job asks for " in e.reason] == expected


@pytest.mark.parametrize("job", ["family", "alternatives", "alternatives-in-regions"])
def test_the_jobs_rows_are_counted_from_the_files_sums_or_searched_in_the_tables_own_key(
    job: str, tmp_path: Path
) -> None:
    """A job that asks nothing of a row but its status and prices counts its candidates from the
    file's per-pair sums and reads no row to count them; one that asks more (the family job's
    vCPUs and memory) makes one pass over its rows, searching (GPU, count[, region]) in the table's
    own key, which holds whole rows, never in an index it would then look each row up from (the
    cloud index holds the same columns after the cloud, and SQLite would take it for `cloud IN`).
    The cheapest candidates are walked in the price indexes from the first row with that price."""
    text = FAMILY_JOB if job == "family" else WIDE_JOBS["alternatives"]
    if job == "alternatives-in-regions":
        text = text.replace("resources:\n", "resources:\n  regions: [us-east-1, eastus]\n")
    rows = grown_rows(12, "types")
    indexed, _, spec = file_and_memory(rows, text, tmp_path)
    conn = indexed.rows._conn  # type: ignore[attr-defined]
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    try:
        assert make_plan(spec, catalog=indexed, baked=False).candidates[:3]
    finally:
        conn.set_trace_callback(None)

    def steps(sql: str) -> str:
        return " / ".join(str(row[3]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}"))

    scans = [steps(sql) for sql in seen if "printf(" in sql]
    sums = [sql for sql in seen if "JOIN pair_counts" in sql]
    if job == "family":
        assert len(scans) == 1 and not sums, seen
        assert "SEARCH offerings USING PRIMARY KEY (gpu=? AND gpu_count=? AND region=?)" in scans[0], scans[0]
    else:
        assert len(sums) == 1 and not scans, seen
        assert ("region=?" in steps(sums[0])) == (job != "alternatives"), steps(sums[0])
    for walk in (steps(sql) for sql in seen if "INDEXED BY by_price" in sql or "INDEXED BY by_spot_price" in sql):
        assert "price_per_hour>?" in walk, walk


@pytest.mark.parametrize("job", ["t4", "family", "spot-capped", *WIDE_JOBS])
def test_a_file_without_sums_plans_the_same_by_counting_rows(job: str, tmp_path: Path) -> None:
    """A catalog file an older gpucloud wrote has no per-pair sums: its rows are counted one by
    one, to the same plan (same candidates in the same order, same exclusions, same printout)."""
    import sqlite3

    text = JOBS.get(job) or WIDE_JOBS[job]
    rows = grown_rows(12, "types")
    indexed, _, spec = file_and_memory(rows, text, tmp_path)
    with_sums = make_plan(spec, catalog=indexed, baked=False)
    expected = (list(with_sums.candidates), list(with_sums.excluded), _printed(with_sums))
    with sqlite3.connect(offerings_db.cache_file()) as conn:
        conn.execute("DELETE FROM meta WHERE key = 'counted_per_gpu'")
        conn.execute("DROP TABLE pair_counts")
    load_catalog.cache_clear()  # type: ignore[attr-defined]
    older = make_plan(spec, catalog=load_catalog(), baked=False)
    assert load_catalog().rows._counted_range is None  # type: ignore[attr-defined]
    assert (list(older.candidates), list(older.excluded), _printed(older)) == expected


def test_the_pairs_a_filter_reads_are_listed_from_it_or_read_from_the_rows(tmp_path: Path) -> None:
    """The (GPU, count) keys a filter is searched by: listed from its GPUs and counts (a listed pair
    the catalog lacks is harmless), read from the rows when it gives no counts; either way every
    pair its rows have is among them."""
    rows = grown_rows(2, "types")
    indexed, _, _ = file_and_memory(rows, JOBS["t4"], tmp_path)
    source = indexed.rows
    for where in (
        RowFilter(clouds=frozenset({"aws"}), gpus=frozenset({"T4", "A10G"})),
        RowFilter(gpus=frozenset({"A100-80GB", "H100"}), count_ranges=((frozenset({"A100-80GB", "H100"}), 2, 8),)),
        RowFilter(gpus=frozenset({"T4"}), gpu_count=4, regions=frozenset({"eastus"})),
    ):
        have = {(o.gpu, o.gpu_count) for o in rows if where.matches(o)}
        keys = source._pairs(where)  # type: ignore[attr-defined]
        assert have and have <= set(keys), (where, have, keys)
        assert all(where.takes(g, n) for g, n in keys)
        if where.gpu_count is None and where.count_ranges is None:
            assert set(keys) == have
