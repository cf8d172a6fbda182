"""AWS refresh source for `gpucloud catalog refresh` (docs/CATALOG.md).

- What exists: `DescribeRegions` (enabled regions), `DescribeInstanceTypes` (GpuInfo: model, count,
  memory; vCPUs, memory, CPU architecture), `DescribeInstanceTypeOfferings` at zone level per region
  (a type is offered in a region when at least one zone sells it).
- Spot: `DescribeSpotPriceHistory` (Linux/UNIX, the latest price per zone; the cheapest zone counts).
  A type with no spot history gets no spot price (unknown), never an estimate.
- On-demand: the Price List *Query API* (`pricing:GetProducts`), one paged query per region for
  `instanceFamily = GPU instance`, Linux, shared tenancy, no pre-installed software, used capacity;
  a type the family query missed is asked for by name. Chosen over the bulk offer files because a
  region's EC2 offer file is hundreds of MB of CSV for the ~100 GPU products we need.

Endpoints: boto3's own `AWS_ENDPOINT_URL` (EC2), `GPUCLOUD_AWS_PRICING_URL` (Price List; default
AWS's us-east-1 pricing endpoint). boto3 is imported inside functions only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpucloud.catalog.models import Offering
from gpucloud.catalog.prices import OLD_PRICE_MARK, cheaper, parse_price
from gpucloud.catalog.refresh import FetchContext, FetchResult, SourceLimit, SourceUnavailable

CLOUD = "aws"
PRICING_URL_ENV = "GPUCLOUD_AWS_PRICING_URL"
PRICING_REGION = "us-east-1"
HOME_REGION = "us-east-1"
FILTER_CHUNK = 100  # instance-type filter values per DescribeInstanceTypeOfferings call
WORKERS = 8
SOURCE = (
    "AWS APIs: DescribeInstanceTypes, DescribeInstanceTypeOfferings (zones), Price List Query API "
    "(on-demand Linux), DescribeSpotPriceHistory (cheapest zone)"
)


# Types whose DescribeInstanceTypes answer is known to be wrong (docs/CATALOG.md, "AWS GPU names"):
# p5en.48xlarge has come back with the GPU name "NVIDIA", p4de.24xlarge with the A100's 40 GB, and
# p5.4xlarge with the 8 GPUs of p5.48xlarge. Their real GPU and count (AWS's instance-type pages).
GPU_OVERRIDES: dict[str, tuple[str, int]] = {
    "p5en.48xlarge": ("H200", 8),
    "p4de.24xlarge": ("A100-80GB", 8),
    "p5.4xlarge": ("H100", 1),
}


@dataclass(frozen=True)
class TypeInfo:
    name: str
    gpu: str  # canonical catalog name
    gpu_count: int
    vcpus: int
    memory_gib: float
    arch: str  # "x86_64" | "arm64"


def _config() -> Any:
    from botocore.config import Config

    return Config(connect_timeout=5, read_timeout=30, retries={"mode": "standard", "max_attempts": 3})


def _session() -> Any:
    import boto3

    return boto3.Session()


def fetch_offerings(ctx: FetchContext) -> FetchResult:
    """Every GPU type in every requested region, with its prices; problems listed, never raised
    unless nothing at all is reachable (then SourceUnavailable)."""
    from botocore.exceptions import BotoCoreError, ClientError

    session = _session()
    home = session.client("ec2", region_name=HOME_REGION, config=_config())
    try:
        enabled = sorted(r["RegionName"] for r in home.describe_regions()["Regions"])
        types, skipped = _gpu_types(home, ctx)
    except (BotoCoreError, ClientError) as exc:
        raise SourceUnavailable(f"EC2 API at {home.meta.endpoint_url}: {_first_line(exc)}") from None
    problems = [f"GPU model not in gpus.csv, types skipped: {s}" for s in skipped]
    regions = enabled if ctx.regions is None else [r for r in ctx.regions if r in enabled]
    problems += [f"region {r} is not an enabled EC2 region" for r in (ctx.regions or []) if r not in enabled]
    ctx.progress(f"{len(types)} GPU instance types; {len(regions)} regions")
    pricing = session.client(
        "pricing", region_name=PRICING_REGION, config=_config(), endpoint_url=os.environ.get(PRICING_URL_ENV) or None
    )
    rows: list[Offering] = []
    done: set[str] = set()
    results = ctx.map_bounded(lambda r: _region(session, pricing, r, types, ctx), regions, WORKERS)
    for region, result in zip(regions, results, strict=True):
        if isinstance(result, SourceLimit):
            problems.append(f"{region}: {result}; kept its previous rows")
            continue
        region_rows, region_problems, ok = result
        rows += region_rows
        problems += region_problems
        if ok:
            done.add(region)
    if regions and not done:
        raise SourceUnavailable("; ".join(problems[-3:]) or "no region could be read")
    return FetchResult(rows=rows, regions=done, source=SOURCE, problems=problems)


def _gpu_types(ec2: Any, ctx: FetchContext) -> tuple[dict[str, TypeInfo], list[str]]:
    """NVIDIA GPU types (whole GPUs only: fractional vGPU sizes report a count of 0)."""
    types: dict[str, TypeInfo] = {}
    unknown: dict[str, list[str]] = {}
    for page in ctx.pages(ec2.get_paginator("describe_instance_types").paginate(), "DescribeInstanceTypes"):
        for it in page["InstanceTypes"]:
            gpus = (it.get("GpuInfo") or {}).get("Gpus") or []
            override = GPU_OVERRIDES.get(it["InstanceType"])
            if override is None and (not gpus or gpus[0].get("Manufacturer") != "NVIDIA" or not gpus[0].get("Count")):
                continue
            g = gpus[0] if gpus else {}
            mem_gib = g.get("MemoryInfo", {}).get("SizeInMiB", 0) / 1024
            canonical, count = override or (ctx.catalog.variant_for(g["Name"].replace(" ", "-"), mem_gib), g["Count"])
            if canonical is None:
                unknown.setdefault(g["Name"], []).append(it["InstanceType"])
                continue
            arches = it.get("ProcessorInfo", {}).get("SupportedArchitectures", ["x86_64"])
            types[it["InstanceType"]] = TypeInfo(
                name=it["InstanceType"],
                gpu=canonical,
                gpu_count=int(count),
                vcpus=int(it["VCpuInfo"]["DefaultVCpus"]),
                memory_gib=round(it["MemoryInfo"]["SizeInMiB"] / 1024, 2),
                arch="arm64" if "arm64" in arches else "x86_64",
            )
    skipped = [f"{name} ({', '.join(sorted(t))})" for name, t in sorted(unknown.items())]
    return types, skipped


def _region(
    session: Any, pricing: Any, region: str, types: dict[str, TypeInfo], ctx: FetchContext
) -> tuple[list[Offering], list[str], bool]:
    """One region's rows; (rows, problems, whether the region's offerings could be read)."""
    from botocore.exceptions import BotoCoreError, ClientError

    ec2 = session.client("ec2", region_name=region, config=_config())
    try:
        zones = _offered_zones(ec2, list(types), ctx)
    except (BotoCoreError, ClientError, SourceLimit) as exc:
        return [], [f"{region}: offerings not readable ({_first_line(exc)}); kept its previous rows"], False
    problems: list[str] = []
    try:
        spot = _spot_prices(ec2, sorted(zones), ctx)
    except (BotoCoreError, ClientError, SourceLimit) as exc:
        spot = {}
        problems.append(f"{region}: spot prices not readable ({_first_line(exc)}); spot unknown there")
    old: dict[str, Offering] = {}
    try:
        on_demand = _on_demand_prices(pricing, region, sorted(zones), ctx)
    except SourceLimit as exc:  # the refresh's own bound: the region is not refreshed (as before)
        return [], [f"{region}: on-demand prices: {exc}; kept its previous rows"], False
    except (BotoCoreError, ClientError) as exc:
        # What is offered is still news: keep each type's previous price, marked old (catalog/prices.py).
        old = {o.instance_type: o for o in ctx.catalog.query(cloud=CLOUD, region=region, include_retired=True)}
        on_demand = {n: old[n].price_per_hour for n in zones if n in old}
        problems.append(
            f"{region}: on-demand prices not readable from the Price List at {pricing.meta.endpoint_url} "
            f"({_first_line(exc)}); offerings refreshed, previous prices kept and marked old"
        )
    rows = []
    for name in sorted(zones):
        t = types[name]
        price = on_demand.get(name)
        if price is None:
            problems.append(f"{region}: {name} has no on-demand Linux price in the Price List; left out")
            continue
        rows.append(_offering(region, t, price, spot.get(name), sorted(zones[name]), old.get(name), ctx))
    ctx.progress(f"{region}: {len(rows)} GPU offerings")
    return rows, problems, True


def _offering(
    region: str,
    t: TypeInfo,
    price: float,
    spot_price: float | None,
    zones: list[str],
    old: Offering | None,
    ctx: FetchContext,
) -> Offering:
    """One observed row; `old`: the type's previous row, whose on-demand price is kept (marked old)
    when the Price List could not be read. A spot price above on-demand is dropped."""
    zone_note = f"zones {','.join(zones)}"
    return Offering(
        cloud=CLOUD,
        instance_type=t.name,
        gpu=t.gpu,
        gpu_count=t.gpu_count,
        vcpus=t.vcpus,
        memory_gib=t.memory_gib,
        arch=t.arch,
        region=region,
        price_per_hour=price,
        spot_price_per_hour=spot_price if spot_price is not None and not spot_price > price else None,
        status="active",
        status_date=ctx.fetched_at[:10],
        status_basis="observed",
        source=(
            f"{OLD_PRICE_MARK} Price List not readable on {ctx.fetched_at}, on-demand price of "
            f"{old.price_date} kept] {SOURCE} [S]; {zone_note}"
            if old is not None
            else f"{SOURCE} [S]; {zone_note}"
        )
        + ("" if spot_price else "; spot unknown: no spot price history"),
        price_date=old.price_date if old is not None else ctx.fetched_at,
    )


def _offered_zones(ec2: Any, names: list[str], ctx: FetchContext) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for chunk in _chunks(names, FILTER_CHUNK):
        pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": chunk}]
        )
        for page in ctx.pages(pages, "DescribeInstanceTypeOfferings"):
            for off in page["InstanceTypeOfferings"]:
                out.setdefault(off["InstanceType"], set()).add(off["Location"])
    return out


def _spot_prices(ec2: Any, names: list[str], ctx: FetchContext) -> dict[str, float]:
    """Cheapest current Linux spot price over the region's zones, per type."""
    best: dict[str, float] = {}
    if not names:
        return best
    now = datetime.now(UTC)
    for chunk in _chunks(names, FILTER_CHUNK):
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=chunk, ProductDescriptions=["Linux/UNIX"], StartTime=now
        )
        for page in ctx.pages(pages, "DescribeSpotPriceHistory"):
            for item in page["SpotPriceHistory"]:
                price = parse_price(item["SpotPrice"])
                if price != 0:  # NaN, inf, negatives go on to the price check
                    best[item["InstanceType"]] = cheaper(best.get(item["InstanceType"]), price)
    return best


_BASE_FILTERS = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}


def _on_demand_prices(pricing: Any, region: str, names: list[str], ctx: FetchContext) -> dict[str, float]:
    """On-demand $/h per type from the Price List Query API: the GPU family in one paged query,
    then by name for any type it missed."""
    prices = _query_prices(pricing, {**_BASE_FILTERS, "regionCode": region, "instanceFamily": "GPU instance"}, ctx)
    for name in names:
        if name not in prices:
            prices.update(_query_prices(pricing, {**_BASE_FILTERS, "regionCode": region, "instanceType": name}, ctx))
    return {n: p for n, p in prices.items() if n in set(names)}


def _query_prices(pricing: Any, filters: dict[str, str], ctx: FetchContext) -> dict[str, float]:
    out: dict[str, float] = {}
    pages = pricing.get_paginator("get_products").paginate(
        ServiceCode="AmazonEC2",
        FormatVersion="aws_v1",
        Filters=[{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()],
    )
    for page in ctx.pages(pages, f"Price List at {pricing.meta.endpoint_url}"):
        for text in page.get("PriceList", []):
            item = json.loads(text) if isinstance(text, str) else text
            name = item.get("product", {}).get("attributes", {}).get("instanceType")
            price = _usd_per_hour(item)
            if name and price is not None:
                out[name] = cheaper(out.get(name), price)
    return out


def _usd_per_hour(item: dict[str, Any]) -> float | None:
    for term in item.get("terms", {}).get("OnDemand", {}).values():
        for dim in term.get("priceDimensions", {}).values():
            usd = parse_price(dim.get("pricePerUnit", {}).get("USD", "0") or 0)
            if usd != 0 and dim.get("unit", "Hrs").lower().startswith("hr"):
                return usd  # NaN, inf, negatives go on to the price check
    return None


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
