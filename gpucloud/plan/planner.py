"""Cost-aware ranking of candidates, with a reason for every exclusion."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC
from typing import TYPE_CHECKING

from gpucloud.catalog.prices import price_problem, price_rule, price_source
from gpucloud.catalog.ranking import gc_paused, row_reason
from gpucloud.catalog.rows import RankKey, RowFilter, rank_key
from gpucloud.contract.provider import Candidate
from gpucloud.plan.fabric import fabric_json
from gpucloud.plan.match import GpuMatch, ImageChoice, PlanStacks
from gpucloud.plan.requests import plan_request, refuse_what_providers_cannot_do
from gpucloud.plan.rows import Exclusion, Exclusions, QuickReasons, RankedCandidates, read_rows

__all__ = ["Candidate", "DataAge", "Exclusion", "Plan", "data_age", "make_plan", "read_rows"]

if TYPE_CHECKING:
    from gpucloud.catalog import Catalog
    from gpucloud.catalog.models import Offering
    from gpucloud.plan.container import ImageCuda
    from gpucloud.plan.container_stack import ContainerPlan
    from gpucloud.plan.images import NodeStack
    from gpucloud.plan.stacks import Stack
    from gpucloud.spec.load import JobSpec


@dataclass
class Plan:
    spec: JobSpec
    candidates: Sequence[Candidate]  # cheapest first = the failover order of `run` (built when read)
    excluded: Sequence[Exclusion]  # catalog order; an `Exclusions` lists the quick ones when iterated
    stack: Stack
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # information, not warnings: `run`'s plan line says it itself
    data: DataAge | None = None  # how old the prices behind the first candidate are
    stacks: dict[str, Stack] = field(default_factory=dict)  # per GPU, when the job accepts several
    container: ContainerPlan | None = None  # a `container:` job: the image, its CUDA, the host stack
    # Each machine's image and install plan, worked out once (a container job's first candidate's as
    # the plan is made, for `plan` to show) and given to its user-data as it is; by (GPU, cloud, type,
    # GPUs, CPU, image).
    nodes: dict[tuple[object, ...], NodeStack] = field(default_factory=dict)

    def requests(self) -> set[str]:
        """The GPU requests (labels) the candidates meet, without building them."""
        if isinstance(self.candidates, RankedCandidates):
            return self.candidates.requests()
        return {c.request for c in self.candidates}

    def stack_for(self, candidate: Candidate) -> Stack:
        """The stack a candidate's machine gets: its GPU's, when the job lists alternatives."""
        return self.stacks.get(candidate.gpu, self.stack)

    def node_for(self, candidate: Candidate) -> NodeStack:
        """The image and install plan a candidate's machine gets (its user-data's stack stage)."""
        c = candidate
        key = (c.gpu, c.cloud, c.instance_type, c.gpu_count, c.arch, c.image)
        if key not in self.nodes:
            from gpucloud.plan.images import candidate_node

            self.nodes[key] = candidate_node(self.stack_for(c), c, self.spec.image)
        size = self.container.image.size_bytes if self.container is not None else 0
        return replace(self.nodes[key], container_bytes=size) if size else self.nodes[key]

    def as_json(self) -> dict[str, object]:
        doc: dict[str, object] = {
            "candidates": [{**c.as_json(), "arch": c.arch, **fabric_json(c)} for c in self.candidates],
            "excluded": [e.as_json() for e in self.excluded],
            "stack": self.stack.as_json(),
            "warnings": list(self.warnings),
            "notes": list(self.notes),
        }
        if self.data is not None:
            doc["catalog"] = self.data.as_json()
        if len(self.stacks) > 1:  # GPU alternatives: each GPU's own stack
            doc["stacks"] = {gpu: stack.as_json() for gpu, stack in sorted(self.stacks.items())}
        if self.container is not None:
            doc["container"] = self.container.as_json()
        return doc


@dataclass(frozen=True)
class DataAge:
    """How old the price behind the first candidate is, and where the catalog came from."""

    origin: str  # "shipped" | "refreshed"
    price_date: str  # the first candidate's price date (ISO, as precise as its source)
    age_days: int
    max_age_days: int

    @property
    def stale(self) -> bool:
        return self.age_days > self.max_age_days

    @property
    def warning(self) -> str:
        return (
            f"prices are {self.age_days} days old ({self.origin} catalog, price date {self.price_date}); "
            "run `gpucloud catalog refresh` for current prices and offerings."
        )

    def as_json(self) -> dict[str, object]:
        return {
            "origin": self.origin,
            "price_date": self.price_date,
            "age_days": self.age_days,
            "max_age_days": self.max_age_days,
            "stale": self.stale,
        }


MAX_AGE_ENV = "GPUCLOUD_CATALOG_MAX_AGE_DAYS"
DEFAULT_MAX_AGE_DAYS = 30


def data_age(cat: Catalog, first: Candidate) -> DataAge | None:
    """Age of the first candidate's price (a partial date counts from its start); None for local."""
    import os
    from datetime import date, datetime

    where = RowFilter(
        clouds=frozenset((first.cloud,)), regions=frozenset((first.region,)), instance_type=first.instance_type
    )
    found = cat.rows.select(where, 1)
    if not found:
        return None
    row = found[0][1]
    text = row.price_date[:10]
    parts = [int(p) for p in text.split("-")] + [1, 1]
    when = date(parts[0], parts[1] or 1, parts[2] or 1)
    age = max(0, (datetime.now(UTC).date() - when).days)
    try:
        limit = int(os.environ.get(MAX_AGE_ENV, DEFAULT_MAX_AGE_DAYS))
    except ValueError:
        limit = DEFAULT_MAX_AGE_DAYS
    return DataAge(origin=cat.meta.origin, price_date=row.price_date, age_days=age, max_age_days=limit)


def make_plan(
    spec: JobSpec,
    *,
    cloud: str | None = None,
    region: str | None = None,
    spot: bool | None = None,
    catalog: Catalog | None = None,
    baked: bool = True,
    estimates: bool = True,
    secrets: Mapping[str, str] | None = None,
) -> Plan:
    """Rank every offering that meets every constraint of `spec`; explain every other one.

    `cloud`, `region` and `spot` are the CLI's overrides; `estimates=False` (`plan --no-estimates`)
    excludes offerings whose price is an estimate, with that reason. Raises UserError (exit 2) when the GPU is
    offered nowhere allowed, or when nothing meets the constraints (with the closest misses). `secrets`: the
    job's secret values, for a `container:` login (gpucloud/plan/container_plan.py)."""
    from gpucloud.catalog import load_catalog
    from gpucloud.contract import registry as providers

    cat = catalog or load_catalog()
    clouds = [cloud] if cloud else list(spec.resources.cloud)
    refuse_what_providers_cannot_do(spec, clouds, spot)
    gpu = _requested_gpu(spec, cat)
    match = GpuMatch(spec, cat) if spec.resources.gpu and not spec.resources.instance_type else None
    wide = match is not None and not match.simple  # alternatives, a model choice or a range
    image = _image(spec, secrets, bool(gpu) or match is not None)
    stack = _fixed_stack(spec, gpu, image) if not wide else None
    priced = [c for c in clouds if providers.info(c).priced]
    if not priced:
        return _unpriced_plan(spec, stack or _fixed_stack(spec, gpu, image), gpu, clouds, image)
    clouds = priced
    regions = _allowed_regions(spec, region, clouds, cat)
    policy: bool | str = spec.resources.spot if spot is None else spot
    variants = match.variants if match is not None and wide else frozenset(cat.members(gpu)) if gpu else frozenset()

    stacks = PlanStacks(spec, stack, image)
    if image is not None and wide:
        from gpucloud.plan.container_plan import some_gpu_fits

        some_gpu_fits(spec, stacks, variants)
    wide_match = match if wide else None
    quick = QuickReasons(spec, wide_match.asked if wide_match else gpu, variants, clouds, regions, wide_match)
    images = ImageChoice(stacks, spec, baked=baked)
    candidates, excluded = _check_rows(cat, quick, spec, policy, images, match, estimates)
    if not candidates:
        from gpucloud.plan.misses import nothing_fits

        raise nothing_fits(spec, gpu if not wide else None, clouds, excluded, cat)
    return _ranked_plan(spec, cat, candidates, excluded, stacks, image, wide)


def _ranked_plan(
    spec: JobSpec,
    cat: Catalog,
    candidates: RankedCandidates,
    excluded: Exclusions,
    stacks: PlanStacks,
    image: ImageCuda | None,
    wide: bool,
) -> Plan:
    """The plan of ranked candidates: the first one's stack, and the warnings of its stack, image, legacy
    GPUs and catalog age."""
    first = stacks.of(candidates[0].gpu)
    assert not isinstance(first, str), "a candidate's stack always resolves"
    warnings: list[str] = list(first.warnings) + list(image.warnings if image else ())
    warnings.extend(_legacy_warnings(candidates.legacy()))
    age = data_age(cat, candidates[0])
    if age is not None and age.stale:
        warnings.append(age.warning)
    plan = Plan(
        spec=spec,
        candidates=candidates,
        excluded=excluded,
        stack=first,
        warnings=warnings,
        data=age,
        stacks=stacks.known() if wide else {},
    )
    plan.container = _container(plan, image, True)
    return plan


def _image(spec: JobSpec, secrets: Mapping[str, str] | None, gpu_job: bool) -> ImageCuda | None:
    """A `container:` job's image and its CUDA (asked once per plan); None for any other job."""
    if spec.container is None:
        return None
    from gpucloud.plan.container_plan import image_of

    return image_of(spec, secrets, gpu_job)


def _fixed_stack(spec: JobSpec, gpu: str | None, image: ImageCuda | None) -> Stack:
    """The stack of a single GPU request: a container job's host stack, or the GPU's usual one."""
    if image is not None:
        from gpucloud.plan.container_plan import stack_of

        return stack_of(spec, gpu or None, image)
    from gpucloud.plan.stacks import resolve_stack

    return resolve_stack(gpu or None, spec.stack)


def _container(plan: Plan, image: ImageCuda | None, install: bool) -> ContainerPlan | None:
    """A `container:` job's image and host stack, the first candidate's install plan worked out
    (and kept) as the plan is made."""
    if image is None:
        return None
    from gpucloud.plan.container_plan import describe

    first = plan.node_for(plan.candidates[0]) if plan.candidates else None
    return describe(plan.spec, image, plan.stack, first, install)


def _check_rows(
    cat: Catalog,
    quick: QuickReasons,
    spec: JobSpec,
    policy: bool | str,
    images: ImageChoice,
    match: GpuMatch | None,
    estimates: bool = True,
) -> tuple[RankedCandidates, Exclusions]:
    """Check in full only the rows no quick reason excludes (read through the catalog's index);
    the others are counted by the returned `Exclusions` and listed when it is iterated. A
    candidate is kept as its sort key and built only when the plan is read that far. A source that
    can (the catalog file) counts and ranks the rows that give candidates itself (`CleanRule`):
    only the rows that are exclusions are read here."""
    keys: list[RankKey] = []
    checked: list[tuple[int, Exclusion]] = []
    gpu, variants, clouds, regions = quick.gpu, quick.variants, quick.cloud_list, quick.regions
    nodes, (cap, why) = spec.num_nodes, spec.price_cap()
    ranks = match.ranks() if match is not None else {}  # Candidate.request -> its place

    def label(name: str, count: int) -> str:
        """Candidate.request: the label of the first GPU request a row meets ("" without requests)."""
        which = match.which_of(name, count) if match is not None else None
        return match.label(which) if match is not None and which is not None else ""

    def check(off: Offering) -> tuple[str | None, list[tuple[bool, float]]]:
        """The row's exclusion reason (None: none) and the markets it gives candidates in."""
        reason = _exclusion_reason(off, spec, gpu, variants, clouds, regions, match)
        if reason is None:
            stack = images.stacks.of(off.gpu)
            if isinstance(stack, str):
                reason = stack
        if reason is not None:
            return reason, []
        markets, reason = _markets(off, policy, (cap, why), estimates)
        return reason, markets

    def why_not(off: Offering) -> str:
        """A deferred row's reason (the catalog file found it gives no candidate)."""
        return check(off)[0] or "gives no candidate"

    part, selected, read = read_rows(cat, quick, spec, policy, match, images.stacks, estimates)
    with gc_paused():  # tens of thousands of rows: no cycles to collect (catalog/ranking.py)
        for ordinal, off in selected:
            reason, markets = check(off)
            rank = ranks.get(label(off.gpu, off.gpu_count), 0) if markets else 0
            for is_spot, price in markets:
                keys.append(rank_key(off, ordinal, is_spot, price, nodes, rank))
            if reason is not None:
                checked.append((ordinal, Exclusion(off.cloud, off.region, off.instance_type, reason)))

    def build(key: RankKey) -> Candidate:
        return _candidate(key[-1], key[6], key[8], spec, images, label(key[-1].gpu, key[-1].gpu_count))

    return RankedCandidates(keys, build, part, label), Exclusions(checked, read, cat.rows, quick, part, why_not)


def _requested_gpu(spec: JobSpec, cat: Catalog) -> str | None:
    """The canonical GPU the job needs: from `gpu:`, else from `instance_type:`'s catalog row."""
    from gpucloud.errors import UserError

    res = spec.resources
    if res.instance_type:
        rows = [o for _, o in cat.rows.select(RowFilter(instance_type=res.instance_type), 1)]
        if not rows:
            import difflib

            known = sorted({o.instance_type for o in cat.offerings})
            close = difflib.get_close_matches(res.instance_type, known, n=3)
            hint = (
                f"Did you mean {', '.join(close)}?"
                if close
                else "`gpucloud catalog --all` lists the known instance types."
            )
            raise UserError(
                f"{_where(spec)}resources.instance_type: {res.instance_type!r} is not in the catalog.", hint=hint
            )
        if res.gpu and rows[0].gpu not in cat.members(res.gpu.model):
            raise UserError(
                f"{_where(spec)}resources: instance_type {res.instance_type} has {rows[0].gpu_count} × {rows[0].gpu}, "
                f"but gpu asks for {res.gpu.model}.",
                hint="Give only one of gpu and instance_type, or make them agree.",
            )
        return rows[0].gpu
    return res.gpu.model if res.gpu else None


def _where(spec: JobSpec) -> str:
    return f"{spec.source}: " if spec.source else ""


def _unpriced_plan(
    spec: JobSpec, stack: Stack, gpu: str | None, clouds: list[str], image: ImageCuda | None = None
) -> Plan:
    """Providers without catalog rows (this machine, an SSH host) plan their own candidates
    (`Provider.plan_candidates`); where the stack install is skipped, the GPU check only warns."""
    from gpucloud.contract import registry as providers

    candidates: list[Candidate] = []
    warnings = list(stack.warnings) + list(image.warnings if image else ())
    notes: list[str] = []
    for name in clouds:
        provider = providers.get_provider(name)
        own = provider.plan_candidates(plan_request(spec, image))
        candidates.extend(replace(c, gpu=gpu or "") for c in own)
        if own and not candidates[: -len(own)]:
            stack = provider.plan_stack(stack)  # the stack as on the machines just planned
        warnings.extend(provider.plan_notes())  # what it left out and why
        if gpu and own and not providers.capabilities(name).install_stack:
            notes.append(
                f"{name} provider: the stack install is skipped; the job uses this machine's {gpu} "
                "if it has one, else the CPU (with a warning in the log)."
            )
    installs = any(providers.capabilities(name).install_stack for name in clouds)
    plan = Plan(spec=spec, candidates=candidates, excluded=[], stack=stack, warnings=warnings, notes=notes)
    plan.container = _container(plan, image, installs)
    return plan


def _allowed_regions(spec: JobSpec, region: str | None, clouds: list[str], cat: Catalog) -> set[str] | None:
    """None means every region; a name no row has is exit 2: a typo's suggestion, or the refresh
    command for a real region the catalog in use lacks (gpucloud/catalog/regions.py)."""
    from gpucloud.contract import registry as providers

    wanted = [region] if region else (spec.resources.regions or [])
    if not wanted:
        return None
    # A region of a cloud the job does not allow is harmless (`regions: [us-east-1, eastus]` with
    # `--cloud azure`); only a name no cloud knows is a typo worth stopping for.
    priced = frozenset(providers.priced_clouds())
    for name in wanted:
        if not cat.rows.has(RowFilter(clouds=priced, regions=frozenset((name,)))):
            from gpucloud.catalog.regions import unknown_region

            where = "--region" if region else f"{_where(spec)}resources.regions"
            raise unknown_region(name, where, {c: cat.regions(c) for c in sorted(priced)})
    return set(wanted)


def _exclusion_reason(
    off: Offering,
    spec: JobSpec,
    gpu: str | None,
    variants: frozenset[str],
    clouds: list[str],
    regions: set[str] | None,
    match: GpuMatch | None = None,
) -> str | None:
    """The first constraint the offering breaks, in the order a user thinks about them. The checks
    of the row's own columns past the GPU (host CPU, retired, vCPUs, memory) are catalog/ranking.py
    ROW_TERMS, declared once: the catalog file's query reads the same terms as SQL."""
    res = spec.resources
    if off.cloud not in clouds:
        return f"cloud {off.cloud} not allowed (resources.cloud is {', '.join(clouds)})"
    if regions is not None and off.region not in regions:
        return f"region {off.region} not in {', '.join(sorted(regions))}"
    if res.instance_type and off.instance_type != res.instance_type:
        return f"instance type is not {res.instance_type}"
    if match is not None and not match.simple:
        if off.gpu not in variants:
            return f"has {off.gpu}, job asks for {match.asked}"
        if match.which(off) is None:
            return match.miss(off)
    else:
        if gpu and off.gpu not in variants:
            return f"has {off.gpu}, job asks for {gpu}"
        if res.gpu and off.gpu_count != res.gpu.count:
            return f"has {off.gpu_count} × {off.gpu} per node, job asks for {res.gpu.count}"
    return row_reason(off, res)


def _markets(
    off: Offering, policy: bool | str, limit: tuple[float | None, str], estimates: bool = True
) -> tuple[list[tuple[bool, float]], str | None]:
    """(spot?, price per node) of each market the offering is a candidate in; or why there is none.

    spot: false -> on-demand; true -> spot only; auto -> both, so that failover falls back to
    on-demand when spot capacity is missing (spot ranks first when it is cheaper). The price rule
    is catalog/prices.py `PRICE_TERMS`, which the catalog file's query reads as SQL too, and the
    estimate test `price_source`, written in SQL beside it (prices.estimate_sql)."""
    markets: tuple[bool, ...]
    if policy == "auto":
        markets = (True, False) if off.spot_price_per_hour is not None else (False,)
    elif policy:
        if off.spot_price_per_hour is None:
            return [], "no spot price in the catalog for this type here"
        markets = (True,)
    else:
        markets = (False,)
    if not estimates:
        source = price_source(off)
        if source.kind == "estimate":
            return [], f"price is an estimate ({source.rule}); --no-estimates refuses estimated prices"
    out: list[tuple[bool, float]] = []
    too_dear: list[str] = []
    cap, why = limit  # the price cap and the field it comes from (JobSpec.price_cap)
    breaks = price_rule(cap)
    for is_spot in markets:
        price = off.spot_price_per_hour if is_spot else off.price_per_hour
        assert price is not None
        broken = breaks(price, off.gpu_count)
        if broken == "range":  # NaN would rank first and pass any cap: never a candidate
            bad = price_problem(price, off.gpu_count)
            too_dear.append(f"{'spot' if is_spot else 'on-demand'} price {bad}; run `gpucloud catalog refresh`")
        elif broken == "cap":
            over = f"max_price_per_hour ${cap:g}" if why == "max_price_per_hour" else f"${cap:.3f}/h ({why})"
            too_dear.append(f"{'spot' if is_spot else 'on-demand'} ${price:.3f}/h > {over}")
        else:
            out.append((is_spot, price))
    return out, ("; ".join(too_dear) if not out else None)


def _candidate(
    off: Offering, is_spot: bool, price: float, spec: JobSpec, images: ImageChoice | None, request: str = ""
) -> Candidate:
    total = round(price * spec.num_nodes, 6)
    return Candidate(
        cloud=off.cloud,
        region=off.region,
        instance_type=off.instance_type,
        gpu=off.gpu,
        gpu_count=off.gpu_count,
        num_nodes=spec.num_nodes,
        spot=is_spot,
        price_per_hour=price,
        total_per_hour=total,
        estimated_cost=round(total * spec.max_duration / 3600, 2),
        status=off.status,
        vcpus=off.vcpus,
        memory_gib=off.memory_gib,
        arch=off.arch,
        image=images(off) if images is not None else None,
        request=request,
        price_source=price_source(off),
    )


def _legacy_warnings(types: Iterable[tuple[str, str]]) -> list[str]:
    legacy = sorted({f"{cloud} {kind}" for cloud, kind in types})
    if not legacy:
        return []
    return [
        f"legacy instance types in this plan ({', '.join(legacy)}): the cloud is retiring them; a launch may "
        "fail for lack of capacity or be refused, and the next candidate is tried then."
    ]
