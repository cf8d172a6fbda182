"""The refreshed catalog on disk: one versioned, indexed SQLite file under GPUCLOUD_HOME, written
atomically.

Why SQLite, keyed and indexed: a refreshed catalog holds every region of every cloud (tens to
hundreds of thousands of rows), and `plan` must stay inside 0.3 s whatever its size. Building every
row in Python costs about half a second at 200k rows however they are stored; stored in the order of
(GPU, GPU count, region) with indexes on cloud and region and on instance type, the file lets
`plan` read only the rows of the GPU, count and regions the job asks for and count the others
(bench/bench_plan_rows.py, BENCHMARKS.md). The table's columns are `Offering`'s fields, which are
the shipped offerings.csv header, so a new column is one change in one place. The rows were
validated when the refresh built them, so opening checks only the format version, the column list
and the GPU names (kept in the `meta` table with the row count per cloud: opening reads no row).
The directory carries the format version (`catalog/v2/`), so a newer gpucloud never misreads an
older cache: it ignores it and uses the shipped CSVs. Beside the rows, `pair_counts` holds their sums
per (GPU, count, region, cloud) by market and legacy status, so that most plans count their
candidates without reading a row; a file written before it had them is counted row by row.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import operator
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpucloud.catalog.models import Offering
from gpucloud.catalog.ranking import COLUMNS, ROUND_FUNCTION, CleanCandidates, RuleSql, gc_paused
from gpucloud.catalog.rows import CleanRule, RowFilter, RowSource

if TYPE_CHECKING:
    import sqlite3

    from gpucloud.catalog import CatalogMeta
    from gpucloud.catalog.models import GpuModel

FORMAT_VERSION = 2
_NAN = "NaN"  # how a NaN cell is stored: SQLite stores a NaN REAL as NULL
_FIELDS = Offering._fields
# The table is stored in the order of its key: the rows of one GPU and count, region by region,
# lie together on disk, so the rows a job asks for are read in a few runs of pages (the
# catalog's own order is the `ordinal` column). Other filters go through an index. No index starts
# with the region alone: SQLite would pick it for (region, GPU, count) over the table's own key (both
# hold those columns) and then look each row up in the table, twice the reading
# (bench/bench_plan_alternatives.py).
_KEY = ("gpu", "gpu_count", "region", "ordinal")
_INDEXES = {
    "by_cloud": ("cloud", "region"),
    "by_type": ("instance_type",),
    "by_ordinal": ("ordinal",),  # the first few rows a region constraint excludes, in catalog order
    # the cheapest rows of a GPU and count, walked in price order and stopped (CleanCandidates.head)
    "by_price": ("gpu", "gpu_count", "price_per_hour"),
    "by_spot_price": ("gpu", "gpu_count", "spot_price_per_hour"),
}
_first = operator.itemgetter(0)
# A filter's GPU counts are listed (as keys of the table) when each range spans at most this many.
_LISTED_COUNTS = 64


@dataclass(frozen=True)
class Cached:
    rows: IndexedRows
    meta: CatalogMeta


def cache_file() -> Path:
    """$GPUCLOUD_HOME/catalog/v<format>/catalog.sqlite"""
    from gpucloud.state.home import home_dir

    return home_dir() / "catalog" / f"v{FORMAT_VERSION}" / "catalog.sqlite"


def _listed_counts(where: RowFilter) -> list[int] | None:
    """Every GPU count the filter can take, when it names its GPUs and few counts; else None."""
    if where.gpus is None or (where.gpu_count is None and where.count_ranges is None):
        return None
    if where.gpu_count is not None:
        spans = [(where.gpu_count, where.gpu_count)]
    else:
        spans = [(low, high) for _, low, high in where.count_ranges or ()]
    if any(high - low > _LISTED_COUNTS for low, high in spans):
        return None
    return sorted({n for low, high in spans for n in range(low, high + 1)})


def _where(where: RowFilter, keyed: bool = False) -> tuple[str, list[object]]:
    """The SQL condition and its parameters for a filter (column names are Offering's fields).
    When the filter names its GPUs, the table's own key leads: the GPUs, their counts (listed when
    given as ranges) and the regions are searched in the key, the clouds only filtered (`+cloud`:
    through the cloud index, SQLite would look up every row it finds in the table). `keyed`: the
    caller searches the key's GPU and count itself."""
    parts: list[str] = []
    args: list[object] = []

    def member(column: str, values: list[str] | list[int], negate: bool = False) -> None:
        parts.append(f"{column} {'NOT ' if negate else ''}IN ({', '.join('?' * len(values))})")
        args.extend(values)

    keyed = keyed or where.gpus is not None
    if where.clouds is not None:
        member("+cloud" if keyed else "cloud", sorted(where.clouds))
    if where.regions is not None:
        member("region", sorted(where.regions), negate=where.outside_regions)
    if where.gpus is not None:
        member("gpu", sorted(where.gpus))
    counts = _listed_counts(where)
    if where.gpu_count is not None:
        parts.append("gpu_count = ?")
        args.append(where.gpu_count)
    elif counts is not None:
        member("gpu_count", counts)
    if where.count_ranges is not None:
        ranges = where.count_ranges
        # `+`: a filter, not an index choice (SQLite would split the scan into one index search per range)
        meets = [f"(+gpu IN ({', '.join('?' * len(n))}) AND +gpu_count BETWEEN ? AND ?)" for n, _, _ in ranges]
        parts.append("(" + (" OR ".join(meets) or "0") + ")")
        args.extend(a for names, low, high in where.count_ranges for a in (*sorted(names), low, high))
    if where.instance_type is not None:
        parts.append("instance_type = ?")
        args.append(where.instance_type)
    return (" WHERE " + " AND ".join(parts) if parts else ""), args


class IndexedRows(RowSource):
    """The rows of a catalog file, read by filter through its indexes; the whole table only when a
    caller asks for every row (`catalog`, `--json` exclusions, a refresh)."""

    ranks_itself = True

    def __init__(
        self,
        conn: sqlite3.Connection,
        cloud_rows: dict[str, int],
        nan_columns: tuple[int, ...] = (),
        counted_range: tuple[float, float] | None = None,
    ) -> None:
        self._conn, self._cloud_rows, self._nan_columns = conn, cloud_rows, nan_columns
        self._counted_range = counted_range  # the sane price range `pair_counts` was counted with
        self._total = sum(cloud_rows.values())
        self._all: tuple[Offering, ...] | None = None

    def _make(self, values: tuple[object, ...]) -> Offering:
        """A row from its stored values; a NaN stored as text (SQLite would turn it into NULL) is
        a NaN again, so the planner's price check sees what the refresh wrote."""
        if self._nan_columns and any(values[i] == _NAN for i in self._nan_columns):
            values = tuple(math.nan if v == _NAN and i in self._nan_columns else v for i, v in enumerate(values))
        return Offering._make(values)

    def __len__(self) -> int:
        return self._total

    def all(self) -> tuple[Offering, ...]:
        if self._all is None:
            with gc_paused():
                make = self._make if self._nan_columns else Offering._make
                self._all = tuple(map(make, self._conn.execute(f"SELECT {COLUMNS} FROM offerings ORDER BY ordinal")))
        return self._all

    def select(self, where: RowFilter, limit: int | None = None) -> list[tuple[int, Offering]]:
        cond, args = _where(where)
        # The first few rows outside the job's regions are most rows: walk the catalog order and
        # stop, rather than gather every one of them to sort.
        walk = " INDEXED BY by_ordinal" if where.outside_regions and limit is not None else ""
        if where.instance_type is not None and not walk:
            walk = " INDEXED BY by_type"  # one type's rows (a plan's price date), not its region's
        sql = f"SELECT ordinal, {COLUMNS} FROM offerings{walk}{cond}"
        make = self._make if self._nan_columns else Offering._make
        with gc_paused():
            if limit is not None:
                sql += f" ORDER BY ordinal LIMIT {int(limit)}"
                return [(r[0], make(r[1:])) for r in self._conn.execute(sql, args)]
            # Every matching row: sorting them by ordinal here (an int) is a third of what SQLite's
            # sort of the whole rows through a temporary B-tree costs (bench/bench_plan_rows.py).
            found = self._conn.execute(sql, args).fetchall()
            found.sort(key=_first)
            return [(r[0], make(r[1:])) for r in found]

    def count(self, where: RowFilter) -> int:
        if (
            where.outside_regions
            and where.clouds is not None
            and where == RowFilter(clouds=where.clouds, regions=where.regions, outside_regions=True)
        ):
            # the rows of these clouds (known from the write) less those in the regions (an index lookup)
            inside = self.count(dataclasses.replace(where, outside_regions=False))
            return sum(self._cloud_rows.get(c, 0) for c in where.clouds) - inside
        cond, args = _where(where)
        return int(self._conn.execute(f"SELECT count(*) FROM offerings{cond}", args).fetchone()[0])

    def has(self, where: RowFilter) -> bool:
        cond, args = _where(where)
        return bool(self._conn.execute(f"SELECT EXISTS (SELECT 1 FROM offerings{cond})", args).fetchone()[0])

    def regions(self, cloud: str) -> list[str]:
        sql = "SELECT DISTINCT region FROM offerings WHERE cloud = ? ORDER BY region"
        return [r[0] for r in self._conn.execute(sql, (cloud,))]

    def _pairs(self, where: RowFilter) -> list[tuple[str, int]]:
        """The (GPU, GPU count) pairs the filter's rows can have: listed from the filter when it names
        its GPUs and few counts (a pair no row has costs one key probe), else read from the rows."""
        counts = _listed_counts(where)
        if where.gpus is not None and counts is not None:
            return [(g, n) for g in sorted(where.gpus) for n in counts if where.takes(g, n)]
        cond, args = _where(where)
        sql = f"SELECT DISTINCT gpu, gpu_count FROM offerings{cond}"
        return sorted((str(g), int(n)) for g, n in self._conn.execute(sql, args))

    def split_clean(self, where: RowFilter, rule: CleanRule) -> tuple[CleanCandidates, list[tuple[int, Offering]]]:
        """The selection's rows that give candidates (CleanRule), counted and ranked by SQLite and
        built only when read, and the other rows of the selection (each one an exclusion), in catalog
        order, for the planner's full check. Counted per (GPU, GPU count) and market: from the
        file's own counts (`pair_counts`) when the rule asks nothing of a row but its status and
        prices, else in one pass over the selection's rows, a pair at a time through the table's
        key; rows are read only for the pairs that have exclusions. Whether a pair meets a request,
        and its rank, is worked out once per pair, not per row (the rows of a pair that meets none
        are all checked in full). The rows of a requested pair that give no candidate are exclusions
        whatever else is wrong with them: only their ordinals are kept (`part.deferred`), and the
        planner reads their reasons when its exclusions are listed."""
        rules = RuleSql(rule)
        requested: dict[tuple[str, int], int] = {}  # pair -> its request's rank
        unrequested: list[tuple[str, int]] = []
        for pair in self._pairs(where):
            rank = rules.rank_of(*pair)
            if rank is None:
                unrequested.append(pair)
            else:
                requested[pair] = rank
        # the rest of the filter: clouds and regions, searched after the key's GPU and count
        cond, args = _where(dataclasses.replace(where, gpus=None, gpu_count=None, count_ranges=None), keyed=True)
        selection, selection_args = _where(where)
        make = self._make if self._nan_columns else Offering._make
        part = CleanCandidates(self._conn, make, selection or " WHERE 1", selection_args, rules)
        counted = self._counted(list(requested), rules, where, cond, args)
        scanned = list(requested)
        if counted is not None:
            scanned = []
            for pair, (total, found, per_market, legacy) in counted.items():
                part.add(pair, requested[pair], found, per_market, legacy)
                if total > found:
                    scanned.append(pair)
        for pair, found, per_market, legacy, based, ordinals in self._scan(scanned, rules, cond, args):
            if counted is None:
                part.add(pair, requested[pair], found, per_market, legacy)
            part.deferred.extend(ordinals)
            if based:  # the planner would have looked at this GPU's stack for these rows
                part.considered.add(pair[0])
        part.deferred.sort()
        others: list[int] = []
        for gpu, count in unrequested:
            sql = f"SELECT ordinal FROM offerings WHERE gpu = ? AND gpu_count = ?{cond.replace(' WHERE ', ' AND ', 1)}"
            others.extend(int(r[0]) for r in self._conn.execute(sql, [gpu, count, *args]))
        rest: list[tuple[int, Offering]] = []
        if others:
            others.sort()
            make = self._make if self._nan_columns else Offering._make
            sql = f"SELECT ordinal, {COLUMNS} FROM offerings WHERE ordinal IN (SELECT value FROM json_each(?))"
            with gc_paused():
                found_rows = self._conn.execute(sql, (json.dumps(others),)).fetchall()
                found_rows.sort(key=_first)
                rest = [(r[0], make(r[1:])) for r in found_rows]
        return part, rest

    def _counted(
        self, pairs: list[tuple[str, int]], rules: RuleSql, where: RowFilter, cond: str, args: list[object]
    ) -> dict[tuple[str, int], tuple[int, int, tuple[int, ...], int]] | None:
        """Per pair: (rows, rows giving candidates, candidates per market, legacy rows among those),
        summed from `pair_counts`; None when the file has none for this sane price range or the rule
        asks more of a row (a row term those counts were not written with, a cap, no estimates) than
        those counts hold. A host CPU: pair_counts are not split by it (`_other_arch`)."""
        rule = rules.rule
        written = RuleSql(_counts_rule(rule.min_per_gpu, rule.max_per_gpu)).asks
        if (
            self._counted_range != (rule.min_per_gpu, rule.max_per_gpu)
            or set(rules.asks) - {*written, "arch"}
            or rule.cap is not None
            or not rule.estimates
            or where.instance_type is not None
            or self._other_arch(pairs, rule.arches, cond, args)
        ):
            return None
        columns = ["spot" if m else "on_demand" for m in rules.markets]
        gives = "(" + " OR ".join(columns) + ")"
        sql = (
            f"SELECT k.gpu, k.gpu_count, total(n), total(n) FILTER (WHERE {gives}),"
            f" {', '.join(f'total(n) FILTER (WHERE {c})' for c in columns)},"
            f" total(n) FILTER (WHERE {gives} AND legacy) FROM"
            " (SELECT json_extract(value, '$[0]') AS gpu, json_extract(value, '$[1]') AS gpu_count FROM json_each(?))"
            f" AS k JOIN pair_counts AS c ON c.gpu = k.gpu AND c.gpu_count = k.gpu_count"
            f"{cond.replace(' WHERE ', ' AND ', 1)} GROUP BY k.gpu, k.gpu_count"
        )
        out: dict[tuple[str, int], tuple[int, int, tuple[int, ...], int]] = {}
        for gpu, count, total, found, *per_market, legacy in self._conn.execute(sql, [json.dumps(pairs), *args]):
            out[(str(gpu), int(count))] = (int(total), int(found), tuple(int(n) for n in per_market), int(legacy))
        return out

    def _other_arch(
        self, pairs: list[tuple[str, int]], arches: tuple[str, ...] | None, cond: str, args: list[object]
    ) -> bool:
        """Whether a row of these pairs has a host CPU the job does not accept (`pair_counts` are not
        split by arch: such pairs are counted row by row)."""
        if arches is None or not pairs:
            return False
        sql = (
            "SELECT 1 FROM (SELECT json_extract(value, '$[0]') AS gpu, json_extract(value, '$[1]') AS gpu_count"
            " FROM json_each(?)) AS k WHERE EXISTS"
            " (SELECT 1 FROM offerings WHERE gpu = k.gpu AND gpu_count = k.gpu_count"
            f"{cond.replace(' WHERE ', ' AND ', 1)} AND arch NOT IN ({', '.join('?' * len(arches))})) LIMIT 1"
        )
        return self._conn.execute(sql, [json.dumps(pairs), *args, *arches]).fetchone() is not None

    def _scan(
        self, pairs: list[tuple[str, int]], rules: RuleSql, cond: str, args: list[object]
    ) -> Iterator[tuple[tuple[str, int], int, tuple[int, ...], int, int, list[int]]]:
        """Per pair, from its rows: (pair, rows giving candidates, candidates per market, legacy
        rows among those, rows the rule's row checks pass, ordinals of the rows giving none)."""
        if not pairs:
            return
        markets = rules.markets
        flags = ", ".join(f"coalesce({rules.market(m)}, 0) AS m{i}" for i, m in enumerate(markets))
        gives = "b AND (" + " OR ".join(f"m{i}" for i in range(len(markets))) + ")"
        counts = ", ".join(
            [f"count(*) FILTER (WHERE {gives})"]
            + [f"count(*) FILTER (WHERE b AND m{i})" for i in range(len(markets))]
            + [f"count(*) FILTER (WHERE {gives} AND legacy)", "count(*) FILTER (WHERE b)"]
        )
        scan = (
            f"SELECT k.gpu, k.gpu_count, (SELECT printf('{' '.join(['%d'] * (len(markets) + 3))}|', {counts})"
            f" || coalesce(group_concat(ordinal) FILTER (WHERE NOT ({gives})), '') FROM"
            f" (SELECT coalesce({rules.row_base}, 0) AS b, {flags}, status = 'legacy' AS legacy, ordinal"
            f" FROM offerings WHERE gpu = k.gpu AND gpu_count = k.gpu_count{cond.replace(' WHERE ', ' AND ', 1)}"
            " LIMIT -1))"  # LIMIT: not flattened, each condition computed once per row
            " FROM (SELECT json_extract(value, '$[0]') AS gpu, json_extract(value, '$[1]') AS gpu_count"
            " FROM json_each(?)) AS k"
        )
        scan_args = [*rules.row_base_args, *rules.market_args(), *args, json.dumps(pairs)]
        for gpu, count, text in self._conn.execute(scan, scan_args):
            numbers, _, ordinals = str(text).partition("|")
            found, *per_market, legacy, based = (int(n) for n in numbers.split())
            listed = list(map(int, ordinals.split(","))) if ordinals else []
            yield (str(gpu), int(count)), found, tuple(per_market), legacy, based, listed


def read(path: str, gpus: dict[str, GpuModel]) -> Cached | str | None:
    """The cached catalog; None when there is none; a one-line reason when it is unusable (the
    caller falls back to the shipped CSVs and says why)."""
    from gpucloud.catalog import CatalogMeta

    if not path or not os.path.exists(path):
        return None
    import sqlite3  # only when there is a refreshed catalog to read

    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        conn.create_function(ROUND_FUNCTION, 2, round, deterministic=True)
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        doc = dict(conn.execute("SELECT key, value FROM meta").fetchall()) if version == FORMAT_VERSION else {}
    except sqlite3.Error as exc:
        return f"refreshed catalog {path} is unreadable ({type(exc).__name__}); using the shipped data"
    try:
        fields = tuple(json.loads(doc.get("fields", "null")) or ())
        if version != FORMAT_VERSION or fields != _FIELDS:
            conn.close()
            return (
                f"refreshed catalog {path} has another format; using the shipped data (run `gpucloud catalog refresh`)"
            )
        names = set(json.loads(doc["gpus"]))
        cloud_rows = {str(c): int(n) for c, n in json.loads(doc["cloud_rows"]).items()}
        nan_columns = tuple(int(i) for i in json.loads(doc.get("nan_columns", "[]")))
        # absent from a file an older gpucloud wrote: then every job's rows are counted one by one
        low, high = json.loads(doc.get("counted_per_gpu", "null")) or (None, None)
        counted_range = (float(low), float(high)) if low is not None and high is not None else None
    except (sqlite3.Error, ValueError, KeyError, TypeError) as exc:
        conn.close()
        return f"refreshed catalog {path} has malformed rows ({type(exc).__name__}); using the shipped data"
    unknown = names - set(gpus)
    if unknown:
        conn.close()
        return f"refreshed catalog {path} names GPUs this version does not know ({', '.join(sorted(unknown))})"
    meta = CatalogMeta(
        origin="refreshed", created_at=json.loads(doc.get("created_at", "null")), clouds=json.loads(doc["clouds"])
    )
    return Cached(rows=IndexedRows(conn, cloud_rows, nan_columns, counted_range), meta=meta)


def write(
    path: Path,
    offerings: list[Offering] | tuple[Offering, ...],
    *,
    created_at: str,
    clouds: dict[str, dict[str, object]],
) -> None:
    """Write atomically: a temporary file in the same directory, fsync, then rename over the old
    one, so a crash or a second refresh never leaves a half-written cache for `plan` to read."""
    from gpucloud.catalog.prices import MAX_PER_GPU_HOUR, MIN_PER_GPU_HOUR

    path.parent.mkdir(parents=True, exist_ok=True)
    nan_columns = sorted({i for o in offerings for i, v in enumerate(o) if isinstance(v, float) and math.isnan(v)})
    doc = {
        "fields": list(_FIELDS),
        "created_at": created_at,
        "clouds": clouds,
        "cloud_rows": dict(collections.Counter(o.cloud for o in offerings)),
        "gpus": sorted({o.gpu for o in offerings}),
        "nan_columns": nan_columns,
        "counted_per_gpu": [MIN_PER_GPU_HOUR, MAX_PER_GPU_HOUR],
    }
    values: Iterable[tuple[object, ...]] = offerings
    if nan_columns:
        values = [tuple(_NAN if i in nan_columns and v != v else v for i, v in enumerate(o)) for o in offerings]
    import sqlite3

    fd, tmp = tempfile.mkstemp(prefix=".catalog-", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        conn = sqlite3.connect(tmp)
        try:
            conn.execute("PRAGMA journal_mode = OFF")
            conn.execute(  # no column types: values are kept as given
                f"CREATE TABLE offerings (ordinal, {COLUMNS}, PRIMARY KEY ({', '.join(_KEY)})) WITHOUT ROWID"
            )
            conn.executemany(
                f"INSERT INTO offerings VALUES (?, {', '.join('?' * len(_FIELDS))})",
                ((i, *row) for i, row in enumerate(values, 1)),
            )
            for name, columns in _INDEXES.items():
                conn.execute(f"CREATE INDEX {name} ON offerings ({', '.join(columns)})")
            _write_pair_counts(conn, MIN_PER_GPU_HOUR, MAX_PER_GPU_HOUR)
            conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
            conn.executemany("INSERT INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in doc.items()])
            conn.execute(f"PRAGMA user_version = {FORMAT_VERSION}")
            conn.commit()
        finally:
            conn.close()
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _counts_rule(min_per_gpu: float, max_per_gpu: float) -> CleanRule:
    """The rule `pair_counts` are counted by: a job that asks nothing of a row but the sane prices."""
    return CleanRule("auto", 0, 0.0, None, 1, min_per_gpu, max_per_gpu)


def _write_pair_counts(conn: sqlite3.Connection, min_per_gpu: float, max_per_gpu: float) -> None:
    """`pair_counts`: the rows of each (GPU, GPU count, region, cloud) counted by whether each
    market gives a candidate (not retired, a price in the sane range: RuleSql, the planner's own
    conditions in SQL) and whether the row is legacy, so that a plan whose job asks nothing more of
    a row counts its candidates from a few hundred sums, not from every row (split_clean)."""
    rules = RuleSql(_counts_rule(min_per_gpu, max_per_gpu))
    conn.execute(
        "CREATE TABLE pair_counts (gpu, gpu_count, region, cloud, spot, on_demand, legacy, n,"
        " PRIMARY KEY (gpu, gpu_count, region, cloud, spot, on_demand, legacy)) WITHOUT ROWID"
    )
    conn.execute(
        "INSERT INTO pair_counts SELECT gpu, gpu_count, region, cloud, spot, on_demand, legacy, count(*) FROM"
        f" (SELECT gpu, gpu_count, region, cloud, coalesce({rules.row_base} AND {rules.market(True)}, 0) AS spot,"
        f" coalesce({rules.row_base} AND {rules.market(False)}, 0) AS on_demand, status = 'legacy' AS legacy"
        " FROM offerings) GROUP BY gpu, gpu_count, region, cloud, spot, on_demand, legacy",
        [*rules.row_base_args, *rules.args_of(True), *rules.row_base_args, *rules.args_of(False)],
    )


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".")
    return str(value)


def offerings_csv(offerings: list[Offering] | tuple[Offering, ...]) -> str:
    """The shipped offerings.csv format (header = Offering's fields), one row per offering."""
    import csv
    import io

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(_FIELDS)
    for o in offerings:
        writer.writerow([_cell(v) for v in o])
    return buf.getvalue()


def replace_file(path: Path, text: str) -> None:
    """Write a text file atomically (temporary file in the same directory, then rename)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
