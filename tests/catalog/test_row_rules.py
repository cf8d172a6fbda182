"""Each of the planner's row rules is written once (catalog/ranking.py ROW_TERMS, catalog/prices.py
PRICE_TERMS and estimate_sql): for every job of examples/ and a seeded set of fuzzed jobs, over the
shipped rows, a grown catalog and the same rows made odd (statuses, vCPUs, memory, host CPUs, price
sources, NaN prices), the catalog file's SQL takes exactly the markets the planner's Python checks
take, row by row; and a plan made through the file is the plan made in memory."""

from __future__ import annotations

import math
import random
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from gpucloud.catalog import offerings_db, prices, ranking, shipped_catalog
from gpucloud.catalog.prices import ESTIMATE_MARK, OLD_PRICE_MARK
from gpucloud.catalog.ranking import RuleSql, row_reason
from gpucloud.errors import UserError
from gpucloud.plan.planner import _markets, make_plan
from gpucloud.plan.rows import clean_rule
from gpucloud.spec.load import parse_spec
from tests.support.catalog_files import file_and_memory, grown_rows, written

if TYPE_CHECKING:
    from gpucloud.catalog.models import Offering
    from gpucloud.spec.load import JobSpec

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.yaml"))
FUZZED = 32  # seeded jobs: every field the row and price rules read, in random combinations
SOURCES = (
    "observed [S]",
    f"{ESTIMATE_MARK} regional factor]; status: legacy [S]",
    f"observed; cited {ESTIMATE_MARK} an older figure] [S]",  # a mark past the first `;`: not an estimate
    f"{OLD_PRICE_MARK} not readable, kept] {ESTIMATE_MARK} factor]; x",  # an old price wins over the mark
    f"{OLD_PRICE_MARK} not readable, kept] observed",
    f"no marks; {OLD_PRICE_MARK} later]",
)


def _fuzzed_job(seed: int) -> str:
    """A job file with a random mix of the fields the rules read (GPU forms, clouds, regions, spot,
    cap, minimums, host CPU, nodes)."""
    rng = random.Random(seed)
    rows = shipped_catalog().offerings
    pairs = sorted({(o.gpu, o.gpu_count) for o in rows})
    gpu, count = rng.choice(pairs)
    other, other_count = rng.choice(pairs)
    forms = [f"{gpu}:{count}", f"[{gpu}:{count}, {other}:{other_count}]", f"'{gpu}|{other}:{count}'"]
    forms.append(f"{{memory: {rng.choice([16, 24, 40])}GB.., count: 1..{rng.choice([1, 4, 8])}}}")
    lines = [f"  gpu: {rng.choice(forms)}", f"  cloud: {rng.choice(['aws', 'azure', '[aws, azure]'])}"]
    if rng.random() < 0.4:
        regions = sorted({o.region for o in rows if o.cloud in ("aws", "azure")})
        lines.append(f"  regions: [{', '.join(rng.sample(regions, rng.randint(1, 3)))}]")
    lines.append(f"  spot: {rng.choice(['true', 'false', 'auto'])}")
    optional = {
        "max_price_per_hour": rng.choice([0.3, 1.5, 6.0, 40.0]),
        "min_vcpus": rng.choice([4, 8, 32, 96]),
        "min_memory_gib": rng.choice([16, 64, 512]),
        "arch": rng.choice(["arm64", "any", "x86_64"]),
        "gpu_order": "ordered",
    }
    lines += [f"  {k}: {v}" for k, v in optional.items() if rng.random() < 0.4]
    nodes = f"num_nodes: {rng.randint(2, 3)}\n" if rng.random() < 0.3 else ""
    return "name: fuzz\nresources:\n" + "\n".join(lines) + f"\n{nodes}run: 'true'\nmax_duration: 2h\n"


def _job_text(job: str) -> str:
    return (REPO / "examples" / job).read_text() if job in EXAMPLES else _fuzzed_job(int(job))


def _spec(job: str, tmp_path: Path) -> JobSpec:
    return parse_spec(_job_text(job), str(tmp_path / "job.yaml"))


def _odd(rows: list[Offering], seed: int) -> list[Offering]:
    """The rows with a third of them made odd, each in one or two columns the rules read."""
    rng = random.Random(seed)
    out = []
    for o in rows:
        if rng.random() < 0.35:
            change = rng.choice(["status", "vcpus", "memory", "arch", "source", "source", "nan", "spot"])
            o = {
                "status": lambda o: o._replace(status=rng.choice(["active", "legacy", "retired"])),
                "vcpus": lambda o: o._replace(vcpus=rng.choice([2, 8, 32, 96, 192])),
                "memory": lambda o: o._replace(memory_gib=rng.choice([8.0, 64.0, 511.5, 512.0, 2048.0])),
                "arch": lambda o: o._replace(arch="arm64" if o.arch == "x86_64" else "x86_64"),
                "source": lambda o: o._replace(source=rng.choice(SOURCES)),
                "nan": lambda o: o._replace(price_per_hour=math.nan),
                "spot": lambda o: o._replace(spot_price_per_hour=rng.choice([None, math.inf, 0.0001, 3])),
            }[change](o)
        out.append(o)
    return out


CATALOGS = {
    "shipped": lambda: list(shipped_catalog().offerings),
    "grown": lambda: grown_rows(2, "types"),  # a second replica under new instance type names
    "odd": lambda: _odd(list(shipped_catalog().offerings), 7),
}


def _sql_markets(rule: object) -> dict[int, set[bool]]:
    """Per row of the written file (by ordinal): the markets the catalog file's SQL takes."""
    rules = RuleSql(rule)  # type: ignore[arg-type]
    flags = ", ".join(f"coalesce({rules.row_base} AND {rules.market(m)}, 0)" for m in rules.markets)
    args = [a for m in rules.markets for a in (*rules.row_base_args, *rules.args_of(m))]
    conn = sqlite3.connect(offerings_db.cache_file())
    try:
        found = conn.execute(f"SELECT ordinal, {flags} FROM offerings", args).fetchall()
    finally:
        conn.close()
    return {int(r[0]): {m for m, flag in zip(rules.markets, r[1:], strict=True) if flag} for r in found}


def _python_markets(off: Offering, spec: JobSpec, estimates: bool) -> set[bool]:
    """The markets the planner's own checks take for a row that passed the quick reasons."""
    if row_reason(off, spec.resources) is not None:
        return set()
    return {is_spot for is_spot, _ in _markets(off, spec.resources.spot, spec.price_cap(), estimates)[0]}


@pytest.mark.parametrize("catalog", ["odd", "shipped"])
def test_the_file_and_the_planner_take_the_same_markets_of_every_row(catalog: str, tmp_path: Path) -> None:
    rows = CATALOGS[catalog]()
    written(rows, tmp_path)
    for job in [*EXAMPLES, *map(str, range(FUZZED))]:
        spec = _spec(job, tmp_path)
        for estimates in (True, False):
            sql = _sql_markets(clean_rule(spec, spec.resources.spot, estimates))
            python = {i: _python_markets(o, spec, estimates) for i, o in enumerate(rows, 1)}
            assert sql == python, f"{job} (estimates={estimates}): " + ", ".join(
                f"row {i} {rows[i - 1]}: sql {sql[i]} python {python[i]}" for i in python if sql[i] != python[i]
            )


def _priced(spec: JobSpec) -> bool:
    from gpucloud.contract import registry

    return any(registry.info(c).priced for c in spec.resources.cloud)


def _plan_or_refusal(spec: JobSpec, cat: object, estimates: bool) -> object:
    try:
        plan = make_plan(spec, catalog=cat, baked=False, estimates=estimates)  # type: ignore[arg-type]
    except UserError as exc:
        return str(exc)
    return list(plan.candidates), list(plan.excluded), plan.warnings


@pytest.mark.parametrize("catalog", ["odd", "grown"])
def test_a_plan_through_the_file_is_the_plan_in_memory(catalog: str, tmp_path: Path) -> None:
    """The whole plan: the GPU requests and ranks the SQL adds, the deferred exclusions' reasons."""
    rows = CATALOGS[catalog]()
    # the examples the catalog prices (an SSH host's job plans from the host), without a registry's image
    jobs = [j for j in EXAMPLES if "container:" not in _job_text(j) and _priced(_spec(j, tmp_path))]
    for n, job in enumerate([*jobs, *map(str, range(0, FUZZED, 4))]):
        indexed, memory, spec = file_and_memory(rows, _job_text(job), tmp_path)
        estimates = n % 2 == 0
        assert _plan_or_refusal(spec, indexed, estimates) == _plan_or_refusal(spec, memory, estimates), job


def test_a_row_term_is_read_by_both_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropping the vCPU term from ROW_TERMS lets a row with too few vCPUs through in both paths."""
    rows = list(shipped_catalog().offerings)
    written(rows, tmp_path)
    spec = parse_spec("name: j\nresources:\n  gpu: T4\n  min_vcpus: 16\nrun: 'true'\n", "job.yaml")
    small = [i for i, o in enumerate(rows, 1) if o.gpu == "T4" and o.vcpus < 16 and o.status != "retired"]
    assert small and all(not _python_markets(rows[i - 1], spec, True) for i in small)
    assert all(not _sql_markets(clean_rule(spec, spec.resources.spot))[i] for i in small)
    monkeypatch.setattr(ranking, "ROW_TERMS", tuple(t for t in ranking.ROW_TERMS if t.column != "vcpus"))
    assert all(_python_markets(rows[i - 1], spec, True) for i in small)
    assert all(_sql_markets(clean_rule(spec, spec.resources.spot))[i] for i in small)


@pytest.mark.parametrize("source", SOURCES)
def test_the_estimate_test_is_one_rule_in_both_forms(source: str) -> None:
    conn = sqlite3.connect(":memory:")
    in_sql = conn.execute(f"SELECT {prices.estimate_sql('s')} FROM (SELECT ? AS s)", (source,)).fetchone()[0]
    row = shipped_catalog().offerings[0]._replace(source=source)
    assert bool(in_sql) == (prices.price_source(row).kind == "estimate")
