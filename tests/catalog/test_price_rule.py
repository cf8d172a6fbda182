"""The planner's price rule is written once (catalog/prices.py PRICE_TERMS): the planner's check of a
row in Python and the catalog file's SQL condition decide every market of a table of odd prices alike."""

from __future__ import annotations

import math
import sqlite3

import pytest

from gpucloud.catalog import prices
from gpucloud.catalog.models import Offering
from gpucloud.catalog.ranking import RuleSql
from gpucloud.catalog.rows import CleanRule
from gpucloud.plan.planner import _markets

NAN_CELL = "NaN"  # how the catalog file keeps a NaN (catalog/offerings_db.py): SQLite would store NULL
# (on-demand $/h, spot $/h, GPUs per node, max_price_per_hour)
CASES: list[tuple[float, float | None, int, float | None]] = [
    (1.0, 0.3, 1, None),
    (1.0, None, 1, None),
    (math.nan, 0.3, 1, None),
    (1.0, math.nan, 1, None),
    (math.inf, 0.3, 1, None),
    (1.0, -math.inf, 1, None),
    (0.0, 0.3, 1, None),
    (-1.0, 0.3, 1, None),
    (1e-300, 1e300, 1, None),
    (0.005, 0.0049, 1, None),  # the sane range's floor, and just under it
    (200.0, 200.01, 1, None),  # its ceiling, and just over it
    (1600.0, 1600.5, 8, None),  # per GPU: 200 and just over
    (0.04, 0.039, 8, None),
    (3, 2, 1, None),  # integer prices
    (2.5, 2.6, 1, 2.5),  # at the cap, and over it
    (2.4, 1.0, 1, 2.0),
    (math.nan, 5.0, 1, 2.0),
    (1.0, 0.5, 0, None),  # no GPU: the price per GPU is the price
]
POLICIES = {"auto": "auto", True: "spot", False: "on-demand"}  # the planner's policy -> CleanRule's


def _row(price: float, spot: float | None, gpus: int) -> Offering:
    return Offering(
        "aws", "x.large", "T4", gpus, 8, 32.0, "x86_64", "r1", price, spot, "active", "", "observed", "[S]", ""
    )


def _sql_markets(case: tuple[float, float | None, int, float | None], policy: str) -> set[bool]:
    price, spot, gpus, cap = case
    rules = RuleSql(CleanRule(policy, 0, 0.0, cap, 1, prices.MIN_PER_GPU_HOUR, prices.MAX_PER_GPU_HOUR))
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE offerings (price_per_hour, spot_price_per_hour, gpu_count)")
    cells = [NAN_CELL if isinstance(v, float) and math.isnan(v) else v for v in (price, spot)]
    conn.execute("INSERT INTO offerings VALUES (?, ?, ?)", (*cells, gpus))
    flags = ", ".join(f"coalesce({rules.market(m)}, 0)" for m in rules.markets)
    row = conn.execute(f"SELECT {flags} FROM offerings", rules.market_args()).fetchone()
    return {m for m, flag in zip(rules.markets, row, strict=True) if flag}


def _python_markets(case: tuple[float, float | None, int, float | None], policy: bool | str) -> set[bool]:
    price, spot, gpus, cap = case
    return {is_spot for is_spot, _ in _markets(_row(price, spot, gpus), policy, (cap, "max_price_per_hour"))[0]}


@pytest.mark.parametrize("policy", list(POLICIES), ids=list(POLICIES.values()))
@pytest.mark.parametrize("case", CASES, ids=[f"{p}-{s}-{g}gpu-cap{c}" for p, s, g, c in CASES])
def test_the_planner_and_the_catalog_file_take_the_same_markets(
    case: tuple[float, float | None, int, float | None], policy: bool | str
) -> None:
    assert _python_markets(case, policy) == _sql_markets(case, POLICIES[policy])


def test_both_paths_read_the_one_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropping the cap's term from PRICE_TERMS lets a price over the cap through in both paths."""
    over_cap = (2.6, 2.7, 1, 2.5)
    assert _python_markets(over_cap, "auto") == _sql_markets(over_cap, "auto") == set()
    monkeypatch.setattr(prices, "PRICE_TERMS", tuple(t for t in prices.PRICE_TERMS if t[0] != "cap"))
    prices.price_rule.cache_clear()
    assert _python_markets(over_cap, "auto") == _sql_markets(over_cap, "auto") == {True, False}
    monkeypatch.undo()
    prices.price_rule.cache_clear()


def test_a_broken_rule_is_named() -> None:
    breaks = prices.price_rule(2.0)
    assert [breaks(p, 1) for p in (1.0, 2.5, math.nan, 0.001, 300.0)] == [
        None,
        "cap",
        "range",
        "range",
        "range",
    ]
