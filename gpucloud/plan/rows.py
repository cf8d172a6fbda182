"""Which catalog rows a plan reads, and its exclusions listed lazily.

Why: a refreshed catalog can hold hundreds of thousands of rows, and most of them are excluded for
one of three reasons that depend on the row's cloud, region and GPU (or instance type) alone. The
planner reads only the rows that pass those three (`Selection.where`, answered by the catalog's
indexes) and checks them in full; the others are counted, and listed with their reason only when
someone iterates the exclusions (`plan --json`, `plan --all`, the "nothing fits" message). The
list is the same, in the same catalog order, as a check of every row would give.

The candidates are ranked the same way: a plan over every region of a large catalog has tens of
thousands of them, and `plan` shows ten. `RankedCandidates` keeps one small sort key per candidate
and builds a `Candidate` (with its image) only when it is read; the first few are found without
sorting the rest (a heap), and the whole order is sorted only when someone reads past them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol, overload

from gpucloud.catalog.prices import MAX_PER_GPU_HOUR, MIN_PER_GPU_HOUR
from gpucloud.catalog.rows import CleanRule, RankKey, RowFilter

if TYPE_CHECKING:
    from gpucloud.catalog import Catalog
    from gpucloud.catalog.models import Offering
    from gpucloud.catalog.rows import RowSource
    from gpucloud.contract.provider import Candidate
    from gpucloud.plan.match import GpuMatch, PlanStacks
    from gpucloud.spec.load import JobSpec


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
        self,
        spec: JobSpec,
        gpu: str | None,
        variants: frozenset[str],
        clouds: list[str],
        regions: set[str] | None,
        match: GpuMatch | None = None,
    ) -> None:
        self.clouds = frozenset(clouds)
        self.cloud_list = list(clouds)
        self.regions = regions
        self.gpu = gpu
        self.variants = variants
        self.fixed_type = spec.resources.instance_type or ""
        requests = spec.resources.gpu_requests
        one = requests[0] if len(requests) == 1 and requests[0].max_count is None else None
        # GPU alternatives, a model choice or ranges (`match`, named by `gpu`: its requests joined):
        # a row of an asked-for GPU whose count meets no request is excluded for that, like another GPU
        self.match = match if gpu and not self.fixed_type else None
        self.count = one.count if one is not None and gpu and not self.fixed_type and not self.match else None
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
            count_ranges=tuple((n, low, high) for n, low, high, _ in self.match.resolved) if self.match else None,
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
        if self.match is not None and self.match.which(off) is None:
            return self.match.miss(off)
        return None


class Exclusions(Sequence[Exclusion]):
    """Every offering that is not a candidate, in catalog order: the checked rows' exclusions are
    held, the rest (excluded by a quick reason, or `deferred`: rows the catalog file says give no
    candidate, whose reason `why_not` works out) are counted and listed when first iterated."""

    def __init__(
        self,
        checked: list[tuple[int, Exclusion]],
        selected: int,
        rows: RowSource,
        quick: QuickReasons,
        part: RankedPart | None = None,
        why_not: Callable[[Offering], str] | None = None,
    ) -> None:
        self._checked = checked
        self._deferred = part.deferred if part is not None and why_not is not None else []
        self._len = len(rows) - selected + len(checked) + len(self._deferred)
        self._rows, self._quick, self._part, self._why_not = rows, quick, part, why_not
        self._list: list[Exclusion] | None = None

    def __len__(self) -> int:
        return self._len

    def _every(self) -> list[Exclusion]:
        if self._list is None:
            checked = dict(self._checked)
            deferred, why_not = set(self._deferred), self._why_not
            reason = self._quick.reason
            out: list[Exclusion] = []
            for i, off in enumerate(self._rows.all(), 1):
                held = checked.get(i)
                if held is not None:
                    out.append(held)
                    continue
                if i in deferred and why_not is not None:
                    out.append(Exclusion(off.cloud, off.region, off.instance_type, why_not(off)))
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
        total = len(kept) + len(self._deferred)  # a deferred row's reason is never a quick one
        if self._deferred and self._part is not None and self._why_not is not None:
            first = self._deferred if limit is None else self._deferred[:limit]
            for i, off in self._part.rows_at(first):
                kept.append((i, Exclusion(off.cloud, off.region, off.instance_type, self._why_not(off))))
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


HEAD = 32  # candidates ranked without sorting the rest: a printed plan shows 10, `run` tries a few


class RankedPart(Protocol):
    """Candidates a row source ranks itself (catalog/ranking.py CleanCandidates)."""

    count: int
    pairs: list[tuple[str, int]]  # the (GPU, GPU count) of the rows it ranks
    deferred: list[int]  # ordinals of rows of those pairs that give no candidate (exclusions)
    considered: set[str]  # GPUs of those rows that pass the row checks: the planner looks at their stacks

    def rows_at(self, ordinals: list[int]) -> list[tuple[int, Offering]]:
        """(ordinal, row) of these rows, in catalog order."""
        ...

    def head(self, n: int) -> list[RankKey]:
        """Keys that include the `n` cheapest."""
        ...

    def every(self) -> list[RankKey]: ...

    def legacy(self) -> set[tuple[str, str]]: ...


class RankedCandidates(Sequence["Candidate"]):
    """Candidates cheapest first (the failover order of `run`), each built from its key when read:
    the planner's own keys, plus a part the row source ranks (its keys fetched only when read)."""

    def __init__(
        self,
        keys: list[RankKey],
        build: Callable[[RankKey], Candidate],
        part: RankedPart | None = None,
        label: Callable[[str, int], str] | None = None,
    ) -> None:
        self._keys, self._build, self._part, self._label = keys, build, part, label
        self._len = len(keys) + (part.count if part is not None else 0)
        self._order: list[RankKey] | None = None  # every key, sorted: once something reads past the head
        self._head: list[RankKey] | None = None
        self._built: dict[int, Candidate] = {}

    def legacy(self) -> list[tuple[str, str]]:
        """(cloud, instance type) of the legacy candidates, sorted, without building any."""
        found = {(k[-1].cloud, k[-1].instance_type) for k in self._keys if k[-1].status == "legacy"}
        if self._part is not None:
            found |= self._part.legacy()
        return sorted(found)

    def requests(self) -> set[str]:
        """Candidate.request of every candidate, without building any (a label depends on the
        row's GPU and GPU count alone)."""
        pairs = {(k[-1].gpu, k[-1].gpu_count) for k in self._keys}
        if self._part is not None and self._part.count:
            pairs |= set(self._part.pairs)
        label = self._label
        return {label(gpu, count) if label is not None else "" for gpu, count in pairs}

    def _ranked(self, stop: int) -> list[RankKey]:
        """At least the first `stop` keys in order."""
        if self._order is None and stop <= HEAD:
            if self._head is None:
                more = self._part.head(HEAD) if self._part is not None else []
                self._head = heapq.nsmallest(HEAD, self._keys + more)  # == sorted(every key)[:HEAD]
            return self._head
        if self._order is None:
            self._order = sorted(self._keys + (self._part.every() if self._part is not None else []))
        return self._order

    def __len__(self) -> int:
        return self._len

    def _at(self, index: int, ranked: list[RankKey]) -> Candidate:
        hit = self._built.get(index)
        if hit is None:
            hit = self._built[index] = self._build(ranked[index])
        return hit

    @overload
    def __getitem__(self, index: int) -> Candidate: ...

    @overload
    def __getitem__(self, index: slice) -> list[Candidate]: ...

    def __getitem__(self, index: int | slice) -> Candidate | list[Candidate]:
        if isinstance(index, slice):
            wanted = range(*index.indices(len(self)))
            ranked = self._ranked(max(wanted, default=-1) + 1)
            return [self._at(i, ranked) for i in wanted]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("candidate index out of range")
        return self._at(index, self._ranked(index + 1))

    def __iter__(self) -> Iterator[Candidate]:
        ranked = self._ranked(len(self) + 1 if len(self) > HEAD else len(self))
        return (self._at(i, ranked) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RankedCandidates({len(self)} candidates)"


def read_rows(
    cat: Catalog,
    quick: QuickReasons,
    spec: JobSpec,
    policy: bool | str,
    match: GpuMatch | None = None,
    stacks: PlanStacks | None = None,
    estimates: bool = True,
) -> tuple[RankedPart | None, list[tuple[int, Offering]], int]:
    """What the planner reads from the catalog: the part of the job's rows the source ranks itself
    (None when it cannot), the rows to check here (in catalog order), and how many rows the quick
    reasons let through. With GPU alternatives or ranges the source is given each request (its
    GPUs whose stack fits the job's pins, its counts, its rank), so that it ranks only the rows the
    planner would take, by request first; the GPUs of those rows count as considered (`stacks`)."""
    if not cat.rows.ranks_itself or quick.fixed_type:
        selected = cat.rows.select(quick.where)
        return None, selected, len(selected)
    part, rest = cat.rows.split_clean(quick.where, clean_rule(spec, policy, estimates, match, stacks))
    if stacks is not None:
        for name in sorted({gpu for gpu, _ in part.pairs} | part.considered):
            stacks.of(name)
    return part, rest, part.rows + len(rest) + len(part.deferred)


def clean_rule(
    spec: JobSpec,
    policy: bool | str,
    estimates: bool = True,
    match: GpuMatch | None = None,
    stacks: PlanStacks | None = None,
) -> CleanRule:
    """What the job asks of a row, for a source that ranks its rows itself: the same fields the
    planner's own checks read (catalog/ranking.py ROW_TERMS, catalog/prices.py PRICE_TERMS)."""
    res = spec.resources
    return CleanRule(
        "auto" if policy == "auto" else "spot" if policy else "on-demand",
        res.min_vcpus or 0,
        res.min_memory_gib or 0.0,
        spec.price_cap()[0],
        spec.num_nodes,
        MIN_PER_GPU_HOUR,
        MAX_PER_GPU_HOUR,
        estimates,
        _clean_requests(match, stacks),
        tuple(sorted(res.arches)) if res.arches is not None else None,
    )


def _clean_requests(
    match: GpuMatch | None, stacks: PlanStacks | None
) -> tuple[tuple[tuple[str, ...], int, int, int], ...] | None:
    """CleanRule.requests: None when the selection's GPU and count are the whole request."""
    if match is None or match.simple:
        return None
    bad = {name for name in match.variants if stacks is not None and not stacks.fits(name)}
    ranks = match.ranks()
    return tuple((tuple(sorted(names - bad)), low, high, ranks[label]) for names, low, high, label in match.resolved)
