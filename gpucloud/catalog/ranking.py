"""The planner's checks of a row's own columns, each declared once with its Python and its SQL
(`ROW_TERMS`: the planner asks `row_reason`, the catalog file's query `RuleSql`; the price rule is
catalog/prices.py's PRICE_TERMS, the estimate test prices.estimate_sql), and the rows of the
refreshed catalog file that give candidates, decided in SQL, and the cheapest of them, ranked by
SQLite by the planner's own key: the candidates of a selection, counted per (GPU, GPU count) and
market and built only when read (`CleanCandidates`). The file itself, its indexes and the pass over
a job's rows are catalog/offerings_db.py's.
"""

from __future__ import annotations

import gc
import operator
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

from gpucloud.catalog.models import Offering
from gpucloud.catalog.prices import estimate_sql, price_sql
from gpucloud.catalog.rows import CleanRule, RankKey, rank_key

if TYPE_CHECKING:
    import sqlite3

COLUMNS = ", ".join(Offering._fields)
ROUND_FUNCTION = "gpucloud_round"  # Python's round() in SQL: the planner ranks by round(total, 6)
# Above this many candidates of a market, the cheapest are found through the price indexes
# (CleanCandidates.head); at or below it they are read whole and sorted (bench_plan_alternatives.py).
WALK_ABOVE = 2048
_PRICE_COLUMN = {True: "spot_price_per_hour", False: "price_per_hour"}


class RowTerm(NamedTuple):
    """One check of a row's own columns, past the quick reasons: the column, how it compares with
    the bound, where the bound comes from (`asks`: the field of that name on the job's resources
    and on a CleanRule alike; "" for the fixed `value`; a bound that is None or 0 drops the term)
    and the exclusion reason a row breaking it gets."""

    column: str
    compare: str  # "in" | ">=" | "!="
    asks: str
    value: object
    reason: Callable[[Offering, Any], str]


# In the order the planner names them (after the cloud, region, type and GPU): a new check is one
# line here, and both the planner and the catalog file's query read it.
ROW_TERMS: tuple[RowTerm, ...] = (
    RowTerm("arch", "in", "arches", None, lambda o, _: f"{o.arch} (resources.arch: {o.arch} or any opens it)"),
    RowTerm("status", "!=", "", "retired", lambda o, _: f"{o.status_text()} ({o.source})"),
    RowTerm("vcpus", ">=", "min_vcpus", None, lambda o, b: f"{o.vcpus} vCPUs < min_vcpus {b}"),
    RowTerm(
        "memory_gib", ">=", "min_memory_gib", None, lambda o, b: f"{o.memory_gib:g} GiB memory < min_memory_gib {b:g}"
    ),
)
_PYTHON_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "in": lambda v, b: v in b,
    ">=": operator.ge,
    "!=": operator.ne,
}


def _sql_compare(column: str, compare: str, bound: Any) -> tuple[str, list[object]]:
    if compare == "in":
        return f"{column} IN ({', '.join('?' * len(bound))})", list(bound)
    return f"{column} {compare} ?", [bound]


def row_terms(asks: object) -> list[tuple[RowTerm, Any]]:
    """The terms a job asks (`asks`: its resources, or a CleanRule), each with its bound."""
    out: list[tuple[RowTerm, Any]] = []
    for term in ROW_TERMS:
        bound = getattr(asks, term.asks) if term.asks else term.value
        if bound is not None and not (isinstance(bound, (int, float)) and bound == 0):
            out.append((term, bound))
    return out


def row_reason(off: Offering, asks: object) -> str | None:
    """The first row term the offering breaks, as the planner words it; None when it breaks none."""
    for term, bound in row_terms(asks):
        if not _PYTHON_COMPARE[term.compare](getattr(off, term.column), bound):
            return term.reason(off, bound)
    return None


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while tens of thousands of rows are built: the rows hold
    no cycles, and every collection would walk all of them again (measured: the rows' build took
    3.5 x longer with the collector running, bench/bench_plan_rows.py)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class RuleSql:
    """A CleanRule in SQL: `row_base` is ROW_TERMS (and, with `estimates=False`, that the row's
    price is no estimate: prices.estimate_sql), `market(spot)` says that a market gives a candidate
    (prices.PRICE_TERMS: a number, a NaN being stored as text, whose price per GPU is in the sane
    range, within the cap). A row passing `base` and one market gives a candidate in each market it
    passes and no exclusion; every other row is an exclusion, whose reason the planner works out.
    With GPU requests, `base` also asks that the row meets one (plan_match.GpuMatch.which, the
    GPUs whose stack does not fit left out) and `rank` is the first one's rank. `asks`: the
    columns of the row terms in force."""

    def __init__(self, rule: CleanRule) -> None:
        self.rule = rule
        self.markets: tuple[bool, ...] = (True, False) if rule.policy == "auto" else (rule.policy == "spot",)
        parts: list[str] = []
        self.row_base_args: list[object] = []
        self.asks: tuple[str, ...] = ()
        for term, bound in row_terms(rule):
            sql, args = _sql_compare(term.column, term.compare, bound)
            parts.append(sql)
            self.row_base_args.extend(args)
            self.asks += (term.column,)
        if not rule.estimates:
            parts.append(f"NOT {estimate_sql('source')}")
        self.row_base = "(" + " AND ".join(parts) + ")"
        # the requests: a condition on the GPU and count alone (split_clean asks it once per pair)
        self.requested, self.requested_args = "1", []
        self.rank, self.rank_args, self.ranks = "0", [], [0]
        if rule.requests is not None:
            meets: list[str] = []
            for names, low, high, _ in rule.requests:
                meets.append(f"(gpu IN ({', '.join('?' * len(names))}) AND gpu_count BETWEEN ? AND ?)")
                self.requested_args.extend([*names, low, high])
            self.requested = "(" + (" OR ".join(meets) or "0") + ")"
            self.ranks = sorted({rank for *_, rank in rule.requests}) or [0]
            if self.ranks != [0]:
                self.rank = "CASE " + " ".join(f"WHEN {m} THEN ?" for m in meets) + " ELSE 0 END"
                self.rank_args = [a for names, low, high, rank in rule.requests for a in (*names, low, high, rank)]
        self.base = f"({self.row_base} AND {self.requested})"
        self.base_args = [*self.row_base_args, *self.requested_args]

    def rank_of(self, gpu: str, count: int) -> int | None:
        """The rank of the first request a GPU and count meet (as `rank`); None when they meet none."""
        if self.rule.requests is None:
            return 0
        return next((r for names, low, high, r in self.rule.requests if gpu in names and low <= count <= high), None)

    def market(self, spot: bool) -> str:
        """The planner's price rule for this market in SQL (catalog/prices.py PRICE_TERMS): the stored
        NaN is TEXT, which compares above every number (the columns have no type, so no conversion),
        and NULL (no price) is NULL; `< 1e999` costs a third of typeof()'s."""
        return self._price_sql(spot)[0]

    def _price_sql(self, spot: bool) -> tuple[str, list[object]]:
        rule = self.rule
        return price_sql(_PRICE_COLUMN[spot], rule.cap, rule.min_per_gpu, rule.max_per_gpu)

    def args_of(self, spot: bool) -> list[object]:
        return self._price_sql(spot)[1]

    def market_args(self) -> list[object]:
        return [a for m in self.markets for a in self.args_of(m)]

    def gives(self) -> tuple[str, list[object]]:
        """The condition of the rows that give candidates, and its parameters."""
        markets = " OR ".join(f"coalesce({self.market(m)}, 0)" for m in self.markets)
        return f" AND coalesce({self.base}, 0) AND ({markets})", [*self.base_args, *self.market_args()]


class CleanCandidates:
    """The candidates of a selection's rows that give some: counted, the cheapest of each market found
    by walking its price index, every one built only when someone reads past the cheapest."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        make: Callable[[tuple[object, ...]], Offering],
        cond: str,
        args: list[object],
        rules: RuleSql,
    ) -> None:
        self._conn, self._make, self._cond, self._args, self._rules = conn, make, cond, args, rules
        self.rows = 0  # rows that give candidates
        self.count = 0  # their candidates (two for a row with both markets under `spot: auto`)
        self.has_legacy = False
        self.pairs: list[tuple[str, int]] = []  # the (GPU, GPU count) of these rows: each has its price index
        # ordinals of the requested pairs' rows that give no candidate: exclusions, whose reasons the
        # planner works out only when its exclusions are listed (plan/rows.py Exclusions)
        self.deferred: list[int] = []
        self.considered: set[str] = set()  # GPUs of deferred rows that pass the row checks (their stacks)
        # per pair: its request rank and its candidates in each market (rules.markets)
        self.per_pair: dict[tuple[str, int], tuple[int, tuple[int, ...]]] = {}

    def rows_at(self, ordinals: list[int]) -> list[tuple[int, Offering]]:
        """(ordinal, row) of these rows in catalog order: the deferred exclusions a listing shows."""
        import json

        if not ordinals:
            return []
        sql = f"SELECT ordinal, {COLUMNS} FROM offerings WHERE ordinal IN (SELECT value FROM json_each(?))"
        found = self._conn.execute(sql, (json.dumps(ordinals),)).fetchall()
        found.sort(key=lambda r: int(r[0]))
        return [(int(r[0]), self._make(r[1:])) for r in found]

    def add(self, pair: tuple[str, int], rank: int, found: int, per_market: tuple[int, ...], legacy: int) -> None:
        """A pair's counts: rows giving candidates, candidates per market, legacy rows among them."""
        if found:
            self.pairs.append(pair)
            self.per_pair[pair] = (rank, per_market)
            self.rows += found
            self.count += sum(per_market)
            self.has_legacy = self.has_legacy or bool(legacy)

    def _keys(self, sql: str, args: list[object], markets: tuple[bool, ...]) -> list[RankKey]:
        """Keys of the rows `sql` reads: (flag per market, ordinal, request rank, the row's columns)."""
        make = self._make
        nodes, width = self._rules.rule.nodes, len(markets)
        out: list[RankKey] = []
        with gc_paused():
            for r in self._conn.execute(sql, args):
                off = make(r[width + 2 :])
                for i, is_spot in enumerate(markets):
                    if r[i]:
                        price = off.spot_price_per_hour if is_spot else off.price_per_hour
                        assert price is not None
                        out.append(rank_key(off, r[width], is_spot, price, nodes, r[width + 1]))
        return out

    def head(self, n: int) -> list[RankKey]:
        """The `n` cheapest of every market, in the planner's order, sorted by SQLite by the planner's
        own key (the total rounded by Python's round, registered as a function, then the same
        columns). When a market has many candidates (more than WALK_ABOVE), only the cheapest are
        read: the n-th smallest price is found by walking the price index of each (GPU, GPU count)
        that has candidates in that market, stopping after `n` rows or after its last candidate (its
        count is known), and the rows up to 3e-6 above it are read through the same index (a row
        above that rounds to a larger total than n rows have, so it is not among them). Few are read
        whole: a price walk would pass the rows of every region the job leaves out. Under ranked
        requests, the n cheapest of each rank: they hold the n first of all (a pair has one rank)."""
        out: list[RankKey] = []
        conn, rules = self._conn, self._rules
        ranked = len(rules.ranks) > 1
        for m, is_spot in enumerate(rules.markets):
            column = "spot_price_per_hour" if is_spot else "price_per_hour"
            index = " INDEXED BY by_spot_price" if is_spot else " INDEXED BY by_price"
            for rank in rules.ranks:
                pairs = {p: k[m] for p, (r, k) in self.per_pair.items() if k[m] and (r == rank or not ranked)}
                if not pairs:
                    continue
                names, counts = sorted({g for g, _ in pairs}), sorted({c for _, c in pairs})
                # the group's (GPU, count) pairs as index prefixes: their cross product is probed
                # `IS NOT NULL`: implied by the market's condition, but only this form lets a walk start
                # past the rows without that price (NULL sorts first in the price index)
                cond = (
                    f"{self._cond} AND {column} IS NOT NULL"
                    f" AND coalesce({rules.base}, 0) AND coalesce({rules.market(is_spot)}, 0)"
                    f"{f' AND {rules.rank} = ?' if ranked else ''}"
                    f" AND gpu IN ({', '.join('?' * len(names))}) AND gpu_count IN ({', '.join('?' * len(counts))})"
                )
                args = [
                    *self._args,
                    *rules.base_args,
                    *rules.args_of(is_spot),
                    *([*rules.rank_args, rank] if ranked else []),
                    *names,
                    *counts,
                ]
                walk = ""
                if sum(pairs.values()) > WALK_ABOVE:
                    prices: list[float] = []
                    for (gpu, count), found in sorted(pairs.items()):  # the n cheapest of each pair hold those of all
                        sql = (
                            f"SELECT {column} FROM offerings{index}{cond} AND gpu = ? AND gpu_count = ?"
                            f" ORDER BY {column} LIMIT {min(int(n), found)}"
                        )
                        prices.extend(float(r[0]) for r in conn.execute(sql, [*args, gpu, count]))
                    prices.sort()
                    if len(prices) >= n:
                        walk = index
                        cond += f" AND {column} <= ?"
                        args.append(prices[n - 1] + 3e-6)
                sql = (
                    f"SELECT 1, ordinal, {rules.rank}, {COLUMNS} FROM offerings{walk}{cond} ORDER BY"
                    f" {ROUND_FUNCTION}({column} * ?, 6), status != 'active', cloud, region, instance_type, ordinal"
                    f" LIMIT {int(n)}"
                )
                out.extend(self._keys(sql, [*rules.rank_args, *args, rules.rule.nodes], (is_spot,)))
        return out

    def every(self) -> list[RankKey]:
        rules = self._rules
        gives, args = rules.gives()
        flags = ", ".join(f"coalesce({rules.market(m)}, 0)" for m in rules.markets)
        sql = f"SELECT {flags}, ordinal, {rules.rank}, {COLUMNS} FROM offerings{self._cond}{gives}"
        return self._keys(sql, [*rules.market_args(), *rules.rank_args, *self._args, *args], rules.markets)

    def legacy(self) -> set[tuple[str, str]]:
        """(cloud, instance type) of the legacy rows among them."""
        if not self.has_legacy:
            return set()
        gives, args = self._rules.gives()
        sql = f"SELECT DISTINCT cloud, instance_type FROM offerings{self._cond}{gives} AND status = 'legacy'"
        return {(str(c), str(t)) for c, t in self._conn.execute(sql, [*self._args, *args])}
