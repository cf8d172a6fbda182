"""Which catalog rows a plan reads, and its exclusions listed lazily.

Why: a refreshed catalog can hold hundreds of thousands of rows, and most of them are excluded for
one of three reasons that depend on the row's cloud, region and GPU (or instance type) alone. The
planner reads only the rows that pass those three (`Selection.where`, answered by the catalog's
indexes) and checks them in full; the others are counted, and listed with their reason only when
someone iterates the exclusions (`plan --json`, `plan --all`, the "nothing fits" message). The
list is the same, in the same catalog order, as a check of every row would give.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple, overload

from gpucloud.catalog.rows import RowFilter

if TYPE_CHECKING:
    from gpucloud.catalog.models import Offering
    from gpucloud.catalog.rows import RowSource
    from gpucloud.spec import JobSpec


class Exclusion(NamedTuple):
    """Why one offering is not a candidate (a NamedTuple: a plan over every region can build tens of
    thousands of these)."""

    cloud: str
    region: str
    instance_type: str
    reason: str

    def as_json(self) -> dict[str, str]:
        return {"cloud": self.cloud, "region": self.region, "instance_type": self.instance_type, "reason": self.reason}


class QuickReasons:
    """The reasons that exclude most rows of a large catalog (another cloud, region, instance type,
    GPU or GPU count), the first four formatted once per value and reused: the same text the
    planner's full check gives for them, in the same order."""

    def __init__(
        self, spec: JobSpec, gpu: str | None, variants: frozenset[str], clouds: list[str], regions: set[str] | None
    ) -> None:
        self.clouds = frozenset(clouds)
        self.cloud_list = list(clouds)
        self.regions = regions
        self.gpu = gpu
        self.variants = variants
        self.fixed_type = spec.resources.instance_type or ""
        requests = spec.resources.gpu_requests
        one = requests[0] if len(requests) == 1 and requests[0].max_count is None else None
        self.count = one.count if one is not None and gpu and not self.fixed_type else None
        self.allowed = ", ".join(clouds)
        self.region_list = ", ".join(sorted(regions)) if regions is not None else ""
        self.memo: dict[tuple[int, str], str] = {}

    @property
    def where(self) -> RowFilter:
        """The rows no quick reason excludes: the only ones the planner checks in full."""
        return RowFilter(
            clouds=self.clouds,
            regions=frozenset(self.regions) if self.regions is not None else None,
            gpus=self.variants if self.gpu and not self.fixed_type else None,
            gpu_count=self.count,
            instance_type=self.fixed_type or None,
        )

    def reason(self, off: Offering) -> str | None:
        """A cached reason for the first checks, else None (the full check decides)."""
        memo = self.memo
        if off.cloud not in self.clouds:
            hit = memo.get((0, off.cloud))
            if hit is None:
                hit = memo[(0, off.cloud)] = f"cloud {off.cloud} not allowed (resources.cloud is {self.allowed})"
            return hit
        if self.regions is not None and off.region not in self.regions:
            hit = memo.get((1, off.region))
            if hit is None:
                hit = memo[(1, off.region)] = f"region {off.region} not in {self.region_list}"
            return hit
        if self.fixed_type:
            return None if off.instance_type == self.fixed_type else f"instance type is not {self.fixed_type}"
        if self.gpu and off.gpu not in self.variants:
            hit = memo.get((2, off.gpu))
            if hit is None:
                hit = memo[(2, off.gpu)] = f"has {off.gpu}, job asks for {self.gpu}"
            return hit
        if self.count is not None and off.gpu_count != self.count:
            return f"has {off.gpu_count} × {off.gpu} per node, job asks for {self.count}"
        return None


class Exclusions(Sequence[Exclusion]):
    """Every offering that is not a candidate, in catalog order: the checked rows' exclusions are
    held, the rest (excluded by a quick reason) are counted and listed when first iterated."""

    def __init__(
        self, checked: list[tuple[int, Exclusion]], selected: int, rows: RowSource, quick: QuickReasons
    ) -> None:
        self._checked = checked
        self._len = len(rows) - selected + len(checked)
        self._rows, self._quick = rows, quick
        self._list: list[Exclusion] | None = None

    def __len__(self) -> int:
        return self._len

    def _every(self) -> list[Exclusion]:
        if self._list is None:
            checked = dict(self._checked)
            reason = self._quick.reason
            out: list[Exclusion] = []
            for i, off in enumerate(self._rows.all(), 1):
                held = checked.get(i)
                if held is not None:
                    out.append(held)
                    continue
                why = reason(off)  # None: a checked row that gave candidates
                if why is not None:
                    out.append(Exclusion(off.cloud, off.region, off.instance_type, why))
            self._list = out
        return self._list

    @overload
    def __getitem__(self, index: int) -> Exclusion: ...

    @overload
    def __getitem__(self, index: slice) -> list[Exclusion]: ...

    def __getitem__(self, index: int | slice) -> Exclusion | list[Exclusion]:
        return self._every()[index]

    def __iter__(self) -> Iterator[Exclusion]:
        return iter(self._every())

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Exclusions({len(self)} rows)"

    def listed(self, hidden: tuple[str, ...], limit: int | None) -> tuple[list[Exclusion], int]:
        """The first `limit` exclusions whose reason starts with none of `hidden`, and how many
        there are. When every quick reason but the region's is hidden, reads only the rows a
        region constraint excludes (counted, and at most `limit` of them read)."""
        quick = self._quick
        kinds = ["cloud "] + (["instance type is not"] if quick.fixed_type else ["has "] if quick.gpu else [])
        if self._list is not None or not all(kind in hidden for kind in kinds):
            return _first(self._every(), hidden, limit)
        kept = [(i, e) for i, e in self._checked if not e.reason.startswith(hidden)]
        total = len(kept)
        if quick.regions is not None and "region " not in hidden:
            outside = RowFilter(clouds=quick.clouds, regions=frozenset(quick.regions), outside_regions=True)
            total += self._rows.count(outside)
            for i, off in self._rows.select(outside, limit):
                kept.append((i, Exclusion(off.cloud, off.region, off.instance_type, quick.reason(off) or "")))
            kept.sort(key=lambda pair: pair[0])
        shown = [e for _, e in kept]
        return (shown if limit is None else shown[:limit]), total


def _first(every: Sequence[Exclusion], hidden: tuple[str, ...], limit: int | None) -> tuple[list[Exclusion], int]:
    kept = [e for e in every if not e.reason.startswith(hidden)]
    return (kept if limit is None else kept[:limit]), len(kept)


def listed_exclusions(
    excluded: Sequence[Exclusion], hidden: tuple[str, ...], limit: int | None
) -> tuple[list[Exclusion], int]:
    """The first `limit` exclusions whose reason starts with none of `hidden`, and their number,
    for a plan's exclusions whether they are listed lazily or held in a list."""
    if isinstance(excluded, Exclusions):
        return excluded.listed(hidden, limit)
    return _first(excluded, hidden, limit)
