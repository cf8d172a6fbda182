"""What counts as a price: finite, above zero and within a sane range per GPU-hour.

A price API that answers NaN, Infinity, 1e308 or 1e-300 must not reach the catalog: NaN sorts
first and passes every `max_price_per_hour` comparison, and 1e-300 prints as `$0.000/h` and
passes any cap. The range is wide on purpose (docs/SECURITY.md, "Prices"): the cheapest GPU-hour
any source lists is a T4 spot at about $0.06 and the dearest an 8-GPU B200 at about $14 per GPU
(docs/CATALOG.md); a bound about ten times beyond each keeps every real price and refuses the
absurd ones.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from gpucloud.contract.provider import PriceSource

if TYPE_CHECKING:
    from gpucloud.catalog.models import Offering

MIN_PER_GPU_HOUR = 0.005
MAX_PER_GPU_HOUR = 200.0


def parse_price(raw: object) -> float:
    """A price field as a float; anything that is not a number becomes NaN (refused later, with
    the row named), so one odd value never stops a whole source."""
    if isinstance(raw, bool):
        return math.nan
    try:
        return float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def cheaper(current: float | None, new: float) -> float:
    """The lower of two prices for the same offering; a non-finite one wins so that the row is
    refused by `check_rows` (min() with NaN depends on the order of its arguments)."""
    if current is None or not math.isfinite(new):
        return new
    if not math.isfinite(current):
        return current
    return min(current, new)


def price_problem(price: float | None, gpu_count: int) -> str | None:
    """Why a price (for the whole machine) is refused, or None when it is sane."""
    if price is None:
        return None
    if not isinstance(price, (int, float)) or not math.isfinite(price):
        return f"{price!r} is not a finite number"
    if price <= 0:
        return f"{price!r} is not above zero"
    per_gpu = price / max(gpu_count, 1)
    if not MIN_PER_GPU_HOUR <= per_gpu <= MAX_PER_GPU_HOUR:
        return (
            f"{price!r} is ${per_gpu:.3g} per GPU-hour, outside the sane range "
            f"${MIN_PER_GPU_HOUR:g}..${MAX_PER_GPU_HOUR:g}"
        )
    return None


# The rule that a market's price gives a candidate, written once: the planner asks it of a row in
# Python (`price_rule`, plan/planner.py) and the catalog file's query asks it in SQL (`price_sql`,
# catalog/ranking.py), both built from these terms. A term is (what it guards, the value, the
# comparison, the bound): the value is the market's price per node or that price per GPU; a bound
# that is None (no cap) drops its term. `price < inf` is the number test: a NaN fails it in Python,
# and so does the text SQLite keeps a NaN as (text compares above every number).
PRICE_TERMS: tuple[tuple[str, str, str, str], ...] = (
    ("range", "price", "<", "infinity"),
    ("range", "per_gpu", "between", "sane"),
    ("cap", "price", "<=", "cap"),
)
_PYTHON_COMPARE: dict[str, tuple[Callable[[float, float], bool], ...]] = {
    "<": (operator.lt,),
    "<=": (operator.le,),
    "between": (operator.ge, operator.le),
}
_SQL_COMPARE = {"<": "{} < {}", "<=": "{} <= {}", "between": "{} BETWEEN {} AND {}"}
PriceBreaks = Callable[[float, int], "str | None"]


def _bound(name: str, cap: float | None, min_per_gpu: float, max_per_gpu: float) -> tuple[float, ...] | None:
    if name == "infinity":
        return (math.inf,)
    if name == "sane":
        return (min_per_gpu, max_per_gpu)
    return None if cap is None else (cap,)


@functools.lru_cache(maxsize=64)
def price_rule(
    cap: float | None, min_per_gpu: float = MIN_PER_GPU_HOUR, max_per_gpu: float = MAX_PER_GPU_HOUR
) -> PriceBreaks:
    """`breaks(price, gpu_count)`: the first rule ("range" or "cap") a market's price per node
    breaks, None when it gives a candidate. Built once per bounds: the planner asks it of every row."""
    checks = [
        (what, value == "per_gpu", compare, limit)
        for what, value, comparison, name in PRICE_TERMS
        if (bound := _bound(name, cap, min_per_gpu, max_per_gpu)) is not None
        for compare, limit in zip(_PYTHON_COMPARE[comparison], bound, strict=True)
    ]

    def breaks(price: float, gpu_count: int) -> str | None:
        if type(price) is not float and type(price) is not int:
            return "range"
        per_gpu = price / max(gpu_count, 1)
        for what, on_gpu, compare, limit in checks:
            if not compare(per_gpu if on_gpu else price, limit):
                return what
        return None

    return breaks


def price_sql(
    column: str, cap: float | None, min_per_gpu: float = MIN_PER_GPU_HOUR, max_per_gpu: float = MAX_PER_GPU_HOUR
) -> tuple[str, list[object]]:
    """`price_rule(...)(price, gpu_count) is None` as an SQL condition on a price column, and its
    parameters: NULL when the row has no such price. Infinity is written out (1e999), the job's
    bounds are parameters."""
    values = {"price": column, "per_gpu": f"{column} * 1.0 / max(gpu_count, 1)"}
    parts: list[str] = []
    args: list[object] = []
    for _, value, compare, name in PRICE_TERMS:
        bound = _bound(name, cap, min_per_gpu, max_per_gpu)
        if bound is None:
            continue
        args.extend(b for b in bound if b != math.inf)
        parts.append(_SQL_COMPARE[compare].format(values[value], *("1e999" if b == math.inf else "?" for b in bound)))
    return "(" + " AND ".join(parts) + ")", args


def check_rows(rows: Iterable[Offering], source: str) -> tuple[list[Offering], list[str]]:
    """Rows whose prices are sane; a row with a bad on-demand price is dropped, a bad spot price
    is cleared (spot unknown); one warning each, naming the source."""
    kept: list[Offering] = []
    problems: list[str] = []
    for row in rows:
        where = f"{source}: {row.instance_type} in {row.region}"
        bad = price_problem(row.price_per_hour, row.gpu_count)
        if bad is not None:
            problems.append(f"{where}: on-demand price {bad}; row dropped")
            continue
        bad = price_problem(row.spot_price_per_hour, row.gpu_count)
        if bad is not None:
            problems.append(f"{where}: spot price {bad}; spot left unknown")
            row = row._replace(spot_price_per_hour=None)
        kept.append(row)
    return kept, problems


OLD_PRICE_MARK = "[old price:"  # a refresh that could not read a price keeps the previous one, marked
ESTIMATE_MARK = "[estimate:"  # a price worked out, not read: marked in the source's first part


def price_source(off: Offering) -> PriceSource:
    """The provenance of an offering's on-demand price, read from its `source` and `price_date`."""
    return _source_of(off.source, off.price_date)


@functools.lru_cache(maxsize=4096)
def _source_of(text: str, price_date: str) -> PriceSource:
    """Memoised: a large catalog repeats a few source texts over tens of thousands of rows."""
    if OLD_PRICE_MARK in text:
        rule = text.split(OLD_PRICE_MARK, 1)[1].split("]", 1)[0].strip()
        return PriceSource("old", price_date, rule)
    head = text.split(";", 1)[0]
    if ESTIMATE_MARK in head:
        return PriceSource("estimate", price_date, head.split(ESTIMATE_MARK, 1)[1].split("]", 1)[0].strip())
    if "T" in price_date:
        return PriceSource("live", price_date)
    return PriceSource("shipped", price_date)


def estimate_sql(column: str = "source") -> str:
    """`price_source(row).kind == "estimate"` as an SQL condition on the source column, beside the
    Python it mirrors (`_source_of`): no old-price mark, and the estimate mark before the first `;`.
    tests/catalog/test_row_rules.py holds the two equal over the shipped, grown and fuzzed rows."""
    marks = (OLD_PRICE_MARK, ESTIMATE_MARK)
    assert not any("'" in m for m in marks), "the marks are written into the SQL as literals"
    head = f"substr({column}, 1, instr({column} || ';', ';') - 1)"
    return f"(instr({column}, '{OLD_PRICE_MARK}') = 0 AND instr({head}, '{ESTIMATE_MARK}') > 0)"
