"""The planner's tests' inputs and oracle: a job spec from resource fields, and the cheapest price
found by reading the catalog directly, written independently of the planner."""

from __future__ import annotations

from gpucloud.catalog import load_catalog
from gpucloud.spec.load import GpuRequest, JobSpec, Resources


def job(**resources: object) -> JobSpec:
    """A job with these resource fields (`gpu="T4:2"` for a model and count), running `true` for an hour."""
    gpu = resources.pop("gpu", None)
    res = Resources(**resources)  # type: ignore[arg-type]
    if gpu:
        model, _, count = str(gpu).partition(":")
        res.gpu = GpuRequest(model=model, count=int(count or 1))
    return JobSpec(name="t", resources=res, run="true", max_duration=3600)


def brute_force_cheapest(spec: JobSpec, policy: bool | str) -> float | None:
    """The lowest $/h per node over the catalog, written independently of the planner."""
    res = spec.resources
    best: float | None = None
    variants = set(load_catalog().members(res.gpu.model)) if res.gpu else set()
    for o in load_catalog().offerings:
        if o.cloud not in res.cloud or o.status == "retired":
            continue
        if res.regions and o.region not in res.regions:
            continue
        if res.gpu and (o.gpu not in variants or o.gpu_count != res.gpu.count):
            continue
        if res.min_vcpus and o.vcpus < res.min_vcpus:
            continue
        if res.min_memory_gib and o.memory_gib < res.min_memory_gib:
            continue
        if res.arch != "any" and o.arch != res.arch:  # x86_64 unless the job opens arm64
            continue
        prices = {
            False: [o.price_per_hour],
            True: [o.spot_price_per_hour] if o.spot_price_per_hour is not None else [],
            "auto": [p for p in (o.price_per_hour, o.spot_price_per_hour) if p is not None],
        }[policy]  # type: ignore[index]
        for p in prices:
            if res.max_price_per_hour is not None and p > res.max_price_per_hour:
                continue
            best = p if best is None else min(best, p)
    return best
