"""Why a plan has no candidate, and what to pick instead: the exit-2 errors of gpucloud/plan/planner.py
when nothing meets the job (the GPU offered nowhere allowed, only on retired types, the closest
misses) and the nearest alternatives. Imported only when a plan comes out empty."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpucloud.catalog import Catalog
    from gpucloud.catalog.models import Offering
    from gpucloud.plan.rows import Exclusion
    from gpucloud.spec.load import JobSpec

CLOSEST_MISSES = 5


def _where(spec: JobSpec) -> str:
    return f"{spec.source}: " if spec.source else ""


def nothing_fits(
    spec: JobSpec, gpu: str | None, clouds: list[str], excluded: Sequence[Exclusion], cat: Catalog
) -> Exception:
    """Exit 2 with a message that says why and what to do instead."""
    from gpucloud.errors import UserError

    where = "/".join(clouds)
    variants = set(cat.members(gpu)) if gpu else set()
    if gpu:
        offered = [o for o in cat.offerings if o.gpu in variants and o.cloud in clouds]
        live = [o for o in offered if o.status != "retired"]
        if not offered:
            return UserError(
                f"{_where(spec)}resources.gpu: no cloud gpucloud can use ({where}) offers the {gpu}"
                f"{_never_offered_note(gpu, cat)}.",
                hint="Nearest alternatives: "
                + "; ".join(alternatives(gpu, clouds, cat, spec.resources.arches))
                + ". "
                + owned_ways(gpu, spec),
            )
        if not live:
            return _only_retired(spec, gpu, where, offered, clouds, cat)
        count = spec.resources.gpu.count if spec.resources.gpu else 0
        if count and not any(o.gpu_count == count for o in live) and any(o.gpu_count == count for o in offered):
            return _count_only_retired(spec, gpu, count, where, offered, live, clouds, cat)
    gone = {(o.cloud, o.instance_type) for o in cat.offerings if o.status == "retired"}
    gpu_of, price_of = _first_gpu_and_price(cat)
    misses = [
        e
        for e in excluded
        if e.cloud in clouds
        and (not gpu or gpu_of.get(e.instance_type, "") in variants)
        and (e.cloud, e.instance_type) not in gone
    ]
    misses.sort(key=lambda e: price_of.get((e.cloud, e.region, e.instance_type), 0.0))
    lines = [f"{e.cloud}/{e.region}/{e.instance_type}: {e.reason}" for e in misses[:CLOSEST_MISSES]]
    return UserError(
        f"{_where(spec)}no offering meets every constraint of the job. Closest misses:\n  - "
        + "\n  - ".join(lines or ["(none)"]),
        hint="Relax the constraint named above (max_cost, max_price_per_hour, regions, gpu count, min_vcpus, spot), "
        "or see `gpucloud catalog --gpu " + (gpu or "T4") + "`.",
    )


def _only_retired(
    spec: JobSpec, gpu: str, where: str, offered: list[Offering], clouds: list[str], cat: Catalog
) -> Exception:
    """The GPU exists only on retired or withdrawn types: say when and on what evidence, and that
    the GPU's software stack is still known (it runs on a machine you own or host)."""
    from gpucloud.errors import UserError

    by_status: dict[tuple[str, str], list[str]] = {}
    for o in sorted(offered, key=lambda o: (o.cloud, o.gpu_count, o.instance_type)):
        types = by_status.setdefault((o.cloud, o.status_text()), [])
        if o.instance_type not in types:
            types.append(o.instance_type)
    dates = [f"{cloud} {', '.join(types)} ({status})" for (cloud, status), types in by_status.items()]
    read_on = {o.cloud: o.status_date for o in offered if o.withdrawn}
    note = "".join(
        f" {c}'s current API does not offer them (none listed in its data read on {day}); no end date was announced."
        for c, day in sorted(read_on.items())
    )
    return UserError(
        f"{_where(spec)}resources.gpu: {where} offers the {gpu} only on retired or withdrawn instance types "
        f"({'; '.join(dates)}).{note}",
        hint="Nearest alternatives: "
        + "; ".join(alternatives(gpu, clouds, cat, spec.resources.arches))
        + ". "
        + owned_ways(gpu, spec),
    )


def _count_only_retired(
    spec: JobSpec,
    gpu: str,
    count: int,
    where: str,
    offered: list[Offering],
    live: list[Offering],
    clouds: list[str],
    cat: Catalog,
) -> Exception:
    """The GPU is still sold, but never `count` to a machine: the types that had that count are
    retired (say when), so point at the counts and GPUs that are live instead of at other retired types."""
    from gpucloud.errors import UserError

    retired = sorted({f"{o.cloud} {o.instance_type} ({o.status_text()})" for o in offered if o.gpu_count == count})
    counts = sorted({o.gpu_count for o in live})
    cheapest = {n: min((o for o in live if o.gpu_count == n), key=lambda o: o.price_per_hour) for n in counts}
    still = "; ".join(
        f"{n} × {o.gpu} on {o.cloud} {o.instance_type} ({o.region}) at ${o.price_per_hour:.3f}/h"
        for n, o in cheapest.items()
    )
    return UserError(
        f"{_where(spec)}resources.gpu: {where} offers {count} × {gpu} per machine only on retired instance types: "
        f"{', '.join(retired[:4])}. Still offered: {still}.",
        hint=f"Ask for one of those counts (gpu: {gpu}:{counts[0]}), or another GPU. Nearest alternatives: "
        + "; ".join(alternatives(gpu, clouds, cat, spec.resources.arches))
        + ".",
    )


def owned_ways(gpu: str, spec: JobSpec) -> str:
    """The providers that still give a GPU the clouds do not sell: a machine of your own (host
    providers) or your cluster (scheduler providers), each with the lines to write, and the stack
    that GPU gets there, as `gpucloud stack` resolves it."""
    from gpucloud.contract.registry import cluster_clouds, host_clouds, info

    count = spec.resources.gpu.count if spec.resources.gpu else 1
    line = f"      gpu: {gpu}:{count}"
    ways = [
        f"    resources:\n      cloud: {name}\n      hosts: [{gpu.lower()}-box]   # ssh alias or user@host[:port]"
        f"\n{line}"
        for name in host_clouds()
    ] + [
        f"    resources:\n      cloud: {name}\n      cluster: hpc-login   # the login node (or local)\n{line}"
        for name in cluster_clouds()
    ]
    example = "examples/k80-ssh.yaml and examples/slurm/k80-slurm.yaml are such jobs" + (
        "" if gpu == "K80" else f" (with gpu: {gpu}:{count})"
    )
    return (
        f"The {gpu} still runs on {' or '.join(info(n).title for n in (*host_clouds(), *cluster_clouds()))}; "
        "write one of:\n" + "\n  or\n".join(ways) + f"\n{example}. {_stack_answer(gpu)}"
    )


def _stack_answer(gpu: str) -> str:
    """What the stack resolver gives that GPU with framework: pytorch (one sentence)."""
    from gpucloud.errors import UserError
    from gpucloud.plan.stacks import resolve_stack
    from gpucloud.spec.models import StackSpec

    try:
        stack = resolve_stack(gpu, StackSpec(framework="pytorch"))
    except UserError as exc:
        return f"There: {str(exc).split('. ', 1)[0].removeprefix('stack.framework: ')} (`gpucloud stack {gpu}`)."
    index = stack.framework_pip[-1].rsplit("/", 1)[-1] if "--index-url" in stack.framework_pip else ""
    wheel = f"{stack.framework_version}+{index}" if index else stack.framework_version
    return (
        f"There it gets driver R{stack.driver}, CUDA {stack.cuda} and PyTorch {wheel} with framework: pytorch "
        f"(`gpucloud stack {gpu}`)."
    )


def _never_offered_note(gpu: str, cat: Catalog) -> str:
    variants = set(cat.members(gpu))
    anywhere = {o.cloud for o in cat.offerings if o.gpu in variants}
    return "; it was never offered by AWS or Azure and exists only on owned or hosted hardware" if not anywhere else ""


def _first_gpu_and_price(cat: Catalog) -> tuple[dict[str, str], dict[tuple[str, str, str], float]]:
    """Each type's GPU and each (cloud, region, type)'s price, from the first row that has it: one
    pass over the catalog, not one per exclusion (thousands of each made an empty plan quadratic)."""
    gpu_of: dict[str, str] = {}
    price_of: dict[tuple[str, str, str], float] = {}
    for o in cat.offerings:
        gpu_of.setdefault(o.instance_type, o.gpu)
        price_of.setdefault((o.cloud, o.region, o.instance_type), o.price_per_hour)
    return gpu_of, price_of


def alternatives(
    gpu: str, clouds: list[str], cat: Catalog, arches: frozenset[str] | None = None, limit: int = 4
) -> list[str]:
    """Same architecture first (any cloud, cheapest row per GPU), then the cheapest current GPU in
    the allowed clouds: what a user asking for an unavailable GPU most likely wants instead. Only
    machines of a host CPU the job accepts (`arches`, resources.arch; None: any)."""
    arch = cat.gpu(gpu).architecture if cat.resolve(gpu) else ""
    variants = set(cat.members(gpu))
    live = [o for o in cat.offerings if o.status != "retired" and (arches is None or o.arch in arches)]
    same_arch = sorted(
        (o for o in live if o.gpu not in variants and cat.gpus[o.gpu].architecture == arch),
        key=lambda o: (o.cloud not in clouds, o.price_per_hour / o.gpu_count),
    )
    current = sorted(
        (o for o in live if o.status == "active" and o.cloud in clouds),
        key=lambda o: o.price_per_hour,
    )
    same_gpu_elsewhere = sorted(
        (o for o in live if o.gpu in variants and o.cloud not in clouds), key=lambda o: o.price_per_hour
    )
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


class GpuRow(Protocol):
    """What `unsold_note` reads of a `gpus` row (ui/catalog.py's GpuSummary)."""

    @property
    def name(self) -> str: ...
    @property
    def clouds(self) -> tuple[str, ...]: ...
    @property
    def retired(self) -> tuple[object, ...]: ...


def unsold_note(summaries: Sequence[GpuRow]) -> str:
    """`gpus`' one line on its rows of `-`: GPUs no cloud sells and none ever did (retired ones
    have their own line), and where they still run."""
    from gpucloud.contract.registry import cluster_clouds, host_clouds

    unsold = [s.name for s in summaries if not s.clouds and not s.retired]
    if not unsold:
        return ""
    places = " or ".join(f"`cloud: {name}`" for name in (*host_clouds(), *cluster_clouds()))
    return (
        f"{', '.join(unsold)}: rows of - because no cloud gpucloud can use sells them; they run on machines "
        f"you own or your cluster ({places}; `gpucloud stack {unsold[0]}` shows their stack)."
    )
