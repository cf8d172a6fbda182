"""Cost-aware ranking of candidates, with a reason for every exclusion. OWNER: lead (types are a contract)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpucloud.catalog import Catalog
    from gpucloud.catalog.models import Offering
    from gpucloud.spec import JobSpec
    from gpucloud.stacks import Stack


@dataclass(frozen=True)
class Candidate:
    cloud: str                 # "aws" | "azure" | "local"
    region: str                # "local" for the local provider
    instance_type: str         # "localhost" for the local provider
    gpu: str                   # canonical GPU name, "" when the job asked for none
    gpu_count: int             # per node
    num_nodes: int
    spot: bool
    price_per_hour: float      # per node
    total_per_hour: float      # price_per_hour * num_nodes
    estimated_cost: float      # total_per_hour * max_duration hours
    status: str = "active"     # offering status ("legacy" candidates carry a warning)
    vcpus: int = 0
    memory_gib: float = 0.0

    def as_json(self) -> dict[str, object]:
        return {
            "cloud": self.cloud, "region": self.region, "instance_type": self.instance_type,
            "gpu": self.gpu, "gpu_count": self.gpu_count, "num_nodes": self.num_nodes,
            "spot": self.spot, "price_per_hour": self.price_per_hour,
            "total_per_hour": self.total_per_hour, "estimated_cost": self.estimated_cost,
        }


@dataclass(frozen=True)
class Exclusion:
    cloud: str
    region: str
    instance_type: str
    reason: str

    def as_json(self) -> dict[str, str]:
        return {"cloud": self.cloud, "region": self.region, "instance_type": self.instance_type, "reason": self.reason}


@dataclass
class Plan:
    spec: JobSpec
    candidates: list[Candidate]   # cheapest first = the failover order of `run`
    excluded: list[Exclusion]
    stack: Stack
    warnings: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {
            "candidates": [c.as_json() for c in self.candidates],
            "excluded": [e.as_json() for e in self.excluded],
            "stack": self.stack.as_json(),
            "warnings": list(self.warnings),
        }


LOCAL_REGION = "local"
LOCAL_INSTANCE = "localhost"
CLOSEST_MISSES = 5


def make_plan(
    spec: JobSpec,
    *,
    cloud: str | None = None,
    region: str | None = None,
    spot: bool | None = None,
    catalog: Catalog | None = None,
) -> Plan:
    """Rank every offering that meets every constraint of `spec`; explain every other one.

    `cloud`, `region` and `spot` are the CLI's overrides. Raises UserError (exit 2) when the GPU is
    offered nowhere allowed, or when nothing meets the constraints (with the closest misses)."""
    from gpucloud.catalog import load_catalog
    from gpucloud.stacks import resolve_stack

    cat = catalog or load_catalog()
    clouds = [cloud] if cloud else list(spec.resources.cloud)
    gpu = _requested_gpu(spec, cat)
    stack = resolve_stack(gpu, spec.stack)
    if clouds == ["local"]:
        return _local_plan(spec, stack, gpu)
    if clouds == ["ssh"]:  # issue-15 branch: the refactor asks every priced=False provider for plan_candidates
        from gpucloud.providers import get_provider

        cands = get_provider("ssh").plan_candidates(spec)  # type: ignore[attr-defined]
        return Plan(spec=spec, candidates=cands, excluded=[], stack=stack, warnings=list(stack.warnings))
    clouds = [c for c in clouds if c != "local"]
    regions = _allowed_regions(spec, region, clouds, cat)
    policy: bool | str = spec.resources.spot if spot is None else spot

    candidates: list[Candidate] = []
    excluded: list[Exclusion] = []
    warnings: list[str] = list(stack.warnings)
    for off in cat.offerings:
        reason = _exclusion_reason(off, spec, gpu, clouds, regions)
        if reason is None:
            options, reason = _priced_options(off, spec, policy)
            candidates.extend(options)
        if reason is not None:
            excluded.append(Exclusion(off.cloud, off.region, off.instance_type, reason))

    candidates.sort(key=lambda c: (c.total_per_hour, c.status != "active", c.cloud, c.region, c.instance_type, c.spot))
    if not candidates:
        raise _nothing_fits(spec, gpu, clouds, excluded, cat)
    warnings.extend(_legacy_warnings(candidates))
    return Plan(spec=spec, candidates=candidates, excluded=excluded, stack=stack, warnings=warnings)


def _requested_gpu(spec: JobSpec, cat: Catalog) -> str | None:
    """The canonical GPU the job needs: from `gpu:`, else from `instance_type:`'s catalog row."""
    from gpucloud.errors import UserError

    res = spec.resources
    if res.instance_type:
        rows = [o for o in cat.offerings if o.instance_type == res.instance_type]
        if not rows:
            import difflib

            known = sorted({o.instance_type for o in cat.offerings})
            close = difflib.get_close_matches(res.instance_type, known, n=3)
            hint = f"Did you mean {', '.join(close)}?" if close else "`gpucloud catalog --all` lists the known instance types."
            raise UserError(f"{_where(spec)}resources.instance_type: {res.instance_type!r} is not in the catalog.", hint=hint)
        if res.gpu and rows[0].gpu != res.gpu.model:
            raise UserError(
                f"{_where(spec)}resources: instance_type {res.instance_type} has {rows[0].gpu_count} × {rows[0].gpu}, "
                f"but gpu asks for {res.gpu.model}.",
                hint="Give only one of gpu and instance_type, or make them agree.",
            )
        return rows[0].gpu
    return res.gpu.model if res.gpu else None


def _where(spec: JobSpec) -> str:
    return f"{spec.source}: " if spec.source else ""


def _local_plan(spec: JobSpec, stack: Stack, gpu: str | None) -> Plan:
    """This machine: one free candidate; the stack install is skipped and the GPU check only warns."""
    count = spec.resources.gpu.count if spec.resources.gpu else 0
    cand = Candidate(
        cloud="local", region=LOCAL_REGION, instance_type=LOCAL_INSTANCE, gpu=gpu or "", gpu_count=count,
        num_nodes=spec.num_nodes, spot=False, price_per_hour=0.0, total_per_hour=0.0, estimated_cost=0.0,
    )
    warnings = list(stack.warnings)
    if gpu:
        warnings.append(f"local provider: the stack install is skipped; the job uses this machine's {gpu} if it has one, else the CPU (with a warning in the log).")
    return Plan(spec=spec, candidates=[cand], excluded=[], stack=stack, warnings=warnings)


def _allowed_regions(spec: JobSpec, region: str | None, clouds: list[str], cat: Catalog) -> set[str] | None:
    """None means every region; unknown region names are a clear error with a suggestion."""
    from gpucloud.errors import UserError

    wanted = [region] if region else (spec.resources.regions or [])
    if not wanted:
        return None
    # A region of a cloud the job does not allow is harmless (`regions: [us-east-1, eastus]` with
    # `--cloud azure`); only a name no cloud knows is a typo worth stopping for.
    known = sorted({r for c in ("aws", "azure") for r in cat.regions(c)})
    for name in wanted:
        if name not in known:
            import difflib

            close = difflib.get_close_matches(name, known, n=3)
            where = "--region" if region else f"{_where(spec)}resources.regions"
            hint = f"Did you mean {', '.join(close)}?" if close else f"Known regions: {', '.join(known)}."
            raise UserError(f"{where}: region {name!r} is not one gpucloud knows.", hint=hint)
    return set(wanted)


def _exclusion_reason(off: Offering, spec: JobSpec, gpu: str | None, clouds: list[str], regions: set[str] | None) -> str | None:
    """The first constraint the offering breaks, in the order a user thinks about them."""
    res = spec.resources
    if off.cloud not in clouds:
        return f"cloud {off.cloud} not allowed (resources.cloud is {', '.join(clouds)})"
    if regions is not None and off.region not in regions:
        return f"region {off.region} not in {', '.join(sorted(regions))}"
    if res.instance_type and off.instance_type != res.instance_type:
        return f"instance type is not {res.instance_type}"
    if gpu and off.gpu != gpu:
        return f"has {off.gpu}, job asks for {gpu}"
    if res.gpu and off.gpu_count != res.gpu.count:
        return f"has {off.gpu_count} × {off.gpu} per node, job asks for {res.gpu.count}"
    if off.status == "retired":
        return f"retired on {off.status_date} ({off.source})"
    if res.min_vcpus and off.vcpus < res.min_vcpus:
        return f"{off.vcpus} vCPUs < min_vcpus {res.min_vcpus}"
    if res.min_memory_gib and off.memory_gib < res.min_memory_gib:
        return f"{off.memory_gib:g} GiB memory < min_memory_gib {res.min_memory_gib:g}"
    return None


def _priced_options(off: Offering, spec: JobSpec, policy: bool | str) -> tuple[list[Candidate], str | None]:
    """Candidates for one offering under the spot policy and max price; or why there are none.

    spot: false -> on-demand; true -> spot only; auto -> both, so that failover falls back to
    on-demand when spot capacity is missing (spot ranks first when it is cheaper)."""
    markets: list[bool]
    if policy == "auto":
        markets = [True, False] if off.spot_price_per_hour is not None else [False]
    elif policy:
        if off.spot_price_per_hour is None:
            return [], "no spot market for this type here"
        markets = [True]
    else:
        markets = [False]
    cap = spec.resources.max_price_per_hour
    out: list[Candidate] = []
    too_dear: list[str] = []
    for is_spot in markets:
        price = off.spot_price_per_hour if is_spot else off.price_per_hour
        assert price is not None
        if cap is not None and price > cap:
            too_dear.append(f"{'spot' if is_spot else 'on-demand'} ${price:.3f}/h > max_price_per_hour ${cap:g}")
            continue
        total = round(price * spec.num_nodes, 6)
        out.append(Candidate(
            cloud=off.cloud, region=off.region, instance_type=off.instance_type, gpu=off.gpu,
            gpu_count=off.gpu_count, num_nodes=spec.num_nodes, spot=is_spot, price_per_hour=price,
            total_per_hour=total, estimated_cost=round(total * spec.max_duration / 3600, 2),
            status=off.status, vcpus=off.vcpus, memory_gib=off.memory_gib,
        ))
    return out, ("; ".join(too_dear) if not out else None)


def _legacy_warnings(candidates: list[Candidate]) -> list[str]:
    legacy = sorted({f"{c.cloud} {c.instance_type}" for c in candidates if c.status == "legacy"})
    if not legacy:
        return []
    return [
        f"legacy instance types in this plan ({', '.join(legacy)}): the cloud is retiring them; a launch may "
        "fail for lack of capacity or be refused, and the next candidate is tried then."
    ]


def _nothing_fits(spec: JobSpec, gpu: str | None, clouds: list[str], excluded: list[Exclusion], cat: Catalog) -> Exception:
    """Exit 2 with a message that says why and what to do instead."""
    from gpucloud.errors import UserError

    where = "/".join(clouds)
    if gpu:
        offered = [o for o in cat.offerings if o.gpu == gpu and o.cloud in clouds]
        live = [o for o in offered if o.status != "retired"]
        if not offered:
            return UserError(
                f"{_where(spec)}resources.gpu: no cloud gpucloud can use ({where}) offers the {gpu}"
                f"{_never_offered_note(gpu, cat)}.",
                hint="Nearest alternatives: " + "; ".join(alternatives(gpu, clouds, cat)) + ".",
            )
        if not live:
            dates = sorted({f"{o.instance_type} retired {o.status_date}" for o in offered})
            return UserError(
                f"{_where(spec)}resources.gpu: {where} offers the {gpu} only on retired instance types "
                f"({', '.join(dates[:4])}).",
                hint="Nearest alternatives: " + "; ".join(alternatives(gpu, clouds, cat)) + ".",
            )
    misses = [e for e in excluded if e.cloud in clouds and (not gpu or _gpu_of(e, cat) == gpu) and "retired" not in e.reason]
    misses.sort(key=lambda e: _price_of(e, cat))
    lines = [f"{e.cloud}/{e.region}/{e.instance_type}: {e.reason}" for e in misses[:CLOSEST_MISSES]]
    return UserError(
        f"{_where(spec)}no offering meets every constraint of the job. Closest misses:\n  - " + "\n  - ".join(lines or ["(none)"]),
        hint="Relax the constraint named above (max_price_per_hour, regions, gpu count, min_vcpus, spot), or see `gpucloud catalog --gpu "
        + (gpu or "T4") + "`.",
    )


def _never_offered_note(gpu: str, cat: Catalog) -> str:
    anywhere = {o.cloud for o in cat.offerings if o.gpu == gpu}
    return "; it was never offered by AWS or Azure and exists only on owned or hosted hardware" if not anywhere else ""


def _gpu_of(e: Exclusion, cat: Catalog) -> str:
    return next((o.gpu for o in cat.offerings if o.instance_type == e.instance_type), "")


def _price_of(e: Exclusion, cat: Catalog) -> float:
    return next((o.price_per_hour for o in cat.offerings if o.instance_type == e.instance_type and o.region == e.region and o.cloud == e.cloud), 0.0)


def alternatives(gpu: str, clouds: list[str], cat: Catalog, limit: int = 4) -> list[str]:
    """Same architecture first (any cloud, cheapest row per GPU), then the cheapest current GPU in
    the allowed clouds: what a user asking for an unavailable GPU most likely wants instead."""
    arch = cat.gpus[gpu].architecture if gpu in cat.gpus else ""
    live = [o for o in cat.offerings if o.status != "retired"]
    same_arch = sorted(
        (o for o in live if o.gpu != gpu and cat.gpus[o.gpu].architecture == arch),
        key=lambda o: (o.cloud not in clouds, o.price_per_hour / o.gpu_count),
    )
    current = sorted(
        (o for o in live if o.status == "active" and o.cloud in clouds),
        key=lambda o: o.price_per_hour,
    )
    same_gpu_elsewhere = sorted((o for o in live if o.gpu == gpu and o.cloud not in clouds), key=lambda o: o.price_per_hour)
    picked: list[str] = []
    seen: set[str] = set()
    for o in [*same_gpu_elsewhere[:1], *same_arch, *current]:
        if o.gpu in seen and o.gpu != gpu:
            continue
        seen.add(o.gpu)
        tag = f" [{o.status}]" if o.status != "active" else ""
        picked.append(f"{o.gpu} on {o.cloud} {o.instance_type} ({o.region}) at ${o.price_per_hour:.3f}/h{tag}")
        if len(picked) >= limit:
            break
    return picked or ["none in the catalog"]
