"""Where a catalog's offerings come from, read by filter: the shipped CSVs in memory, or the refreshed
catalog's indexed SQLite file (catalog/offerings_db.py).

Why a filter and not a full list: a refreshed catalog can hold hundreds of thousands of rows (every
region of every cloud), and `plan` needs only the rows of the GPU and regions the job asks for; the
rest it only counts. Both sources answer the same questions so the planner does not care which one
it reads; rows come back in catalog order with their ordinal (1-based position), so that a plan
can list its exclusions in the same order whether or not it read every row.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeAlias

from gpucloud.catalog.models import Offering


@dataclass(frozen=True, slots=True)
class RowFilter:
    """Rows matching every given field (None: any). With `outside_regions`, the rows of `clouds`
    whose region is NOT one of `regions` (the rows a region constraint excludes). `count_ranges`:
    the row's GPU and count meet one of these (GPU names, lowest count, highest count), as GPU
    alternatives and ranges ask."""

    clouds: frozenset[str] | None = None
    regions: frozenset[str] | None = None
    gpus: frozenset[str] | None = None
    gpu_count: int | None = None
    instance_type: str | None = None
    outside_regions: bool = False
    count_ranges: tuple[tuple[frozenset[str], int, int], ...] | None = None

    def matches(self, o: Offering) -> bool:
        if self.clouds is not None and o.cloud not in self.clouds:
            return False
        if self.regions is not None and (o.region in self.regions) == self.outside_regions:
            return False
        return self.takes(o.gpu, o.gpu_count) and (self.instance_type is None or o.instance_type == self.instance_type)

    def takes(self, gpu: str, count: int) -> bool:
        """Whether a row of this GPU and GPU count can match (the GPU, count and range fields)."""
        if self.gpus is not None and gpu not in self.gpus:
            return False
        if self.gpu_count is not None and count != self.gpu_count:
            return False
        return self.count_ranges is None or any(
            gpu in names and low <= count <= high for names, low, high in self.count_ranges
        )


# A candidate as the planner ranks it: (request rank, total $/h, not active, cloud, region, instance
# type, spot, position, price per node, row). The request rank is the place of the GPU request the
# row meets under `gpu_order: ordered` (else 0). `position` (2 x the row's ordinal, + 1 for on-demand: the order
# the rows are checked, spot first) keeps ties in catalog order, as a stable sort of the candidates
# would, and never lets two rows be compared.
RankKey: TypeAlias = tuple[int, float, bool, str, str, str, bool, int, float, Offering]


def rank_key(off: Offering, ordinal: int, is_spot: bool, price: float, nodes: int, rank: int = 0) -> RankKey:
    return (
        rank,
        round(price * nodes, 6),
        off.status != "active",
        off.cloud,
        off.region,
        off.instance_type,
        is_spot,
        2 * ordinal + (not is_spot),
        price,
        off,
    )


@dataclass(frozen=True, slots=True)
class CleanRule:
    """The rows of a selection that certainly pass the planner's full check and give a candidate in
    every market the spot policy asks for: not retired, at least these vCPUs and memory, and each
    market's price a number in the sane range and within the cap. A source that can find them
    without building them (the catalog file) ranks them itself; every other row is checked in full.

    `estimates=False`: a row whose source may name an estimated price is checked in full.
    `requests` (GPU alternatives or ranges; None: the selection's GPU and count are the request):
    per request the GPU names it accepts (those whose stack fits the job's pins), its count range and
    its rank; a row meeting none is checked in full. `arches`: the host CPUs the job accepts
    (None: any); a row of another is checked in full (excluded for its arch)."""

    policy: str  # "auto" | "spot" | "on-demand"
    min_vcpus: int
    min_memory_gib: float
    cap: float | None
    nodes: int
    min_per_gpu: float
    max_per_gpu: float
    estimates: bool = True
    requests: tuple[tuple[tuple[str, ...], int, int, int], ...] | None = None
    arches: tuple[str, ...] | None = None


class RowSource(Protocol):
    """The questions the planner and the catalog ask of the offerings."""

    def __len__(self) -> int: ...

    def all(self) -> tuple[Offering, ...]:
        """Every row in catalog order."""
        ...

    def select(self, where: RowFilter, limit: int | None = None) -> list[tuple[int, Offering]]:
        """(ordinal, row) of the matching rows in catalog order, at most `limit`."""
        ...

    def count(self, where: RowFilter) -> int: ...

    def has(self, where: RowFilter) -> bool:
        """Whether any row matches (stops at the first)."""
        ...

    def regions(self, cloud: str) -> list[str]:
        """Sorted regions with at least one row of `cloud`."""
        ...

    # Whether the source counts and ranks the rows that give candidates itself (`split_clean`); a
    # source that does not (the shipped CSVs, a hundred-odd rows) has every selected row checked in
    # Python, and is never asked.
    ranks_itself: ClassVar[bool] = False

    def split_clean(self, where: RowFilter, rule: CleanRule) -> tuple[Any, list[tuple[int, Offering]]]:
        """The selection's rows that give candidates under `rule`, counted and ranked by the source,
        and the other rows of the selection in catalog order (asked only when `ranks_itself`). The
        first is a catalog/ranking.py CleanCandidates (that module imports this one)."""
        raise TypeError(f"{type(self).__name__} does not rank its rows: ask it only when ranks_itself")


class MemoryRows(RowSource):
    """Rows held in a tuple (the shipped CSVs: a hundred-odd rows, filtered in Python)."""

    __slots__ = ("_rows",)

    def __init__(self, rows: Iterable[Offering]) -> None:
        self._rows = tuple(rows)

    def __len__(self) -> int:
        return len(self._rows)

    def all(self) -> tuple[Offering, ...]:
        return self._rows

    def select(self, where: RowFilter, limit: int | None = None) -> list[tuple[int, Offering]]:
        out = [(i, o) for i, o in enumerate(self._rows, 1) if where.matches(o)]
        return out if limit is None else out[:limit]

    def count(self, where: RowFilter) -> int:
        return sum(1 for o in self._rows if where.matches(o))

    def has(self, where: RowFilter) -> bool:
        return any(where.matches(o) for o in self._rows)

    def regions(self, cloud: str) -> list[str]:
        return sorted({o.region for o in self._rows if o.cloud == cloud})
