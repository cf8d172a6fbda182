"""Azure refresh source for `gpucloud catalog refresh` (docs/CATALOG.md).

- What exists: the Resource SKUs API (`Microsoft.Compute/skus`) through ARM: GPU count, vCPUs,
  memory, CPU architecture, the regions a size is listed in, minus the regions where a `Location`
  restriction (`NotAvailableForSubscription`) applies to this subscription.
- Which GPU a size has: the small table below (the API gives only a count).
- Prices, on-demand and spot: the public Retail Prices API (no sign-in), `Consumption` Linux rows;
  `skuName` ending in " Spot" is the spot price, " Low Priority" rows are dropped, as are Windows
  rows; pages are followed through `NextPageLink`, at most GPUCLOUD_CATALOG_MAX_PAGES per query and
  each bounded in time: past a bound the source is reported not refreshed, never complete.

Endpoints: `GPUCLOUD_AZURE_ARM_ENDPOINT` (ARM, the provider's setting) and
`GPUCLOUD_AZURE_PRICES_URL` (default https://prices.azure.com/api/retail/prices). The azure SDKs
are imported inside functions only.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

from gpucloud.catalog.models import Offering
from gpucloud.catalog.prices import OLD_PRICE_MARK, cheaper, parse_price
from gpucloud.catalog.refresh import FetchContext, FetchResult, SourceUnavailable

CLOUD = "azure"
PRICES_URL_ENV = "GPUCLOUD_AZURE_PRICES_URL"
DEFAULT_PRICES_URL = "https://prices.azure.com/api/retail/prices"
SKUS_PER_QUERY = 10
REQUEST_S = 120.0  # one page, however slowly the server answers (the refresh's deadline bounds the rest)
MAX_PAGE_BYTES = 64 * 1024 * 1024
SOURCE = "Azure APIs: Resource SKUs (ARM), Retail Prices API (Consumption, Linux)"

# Size name pattern -> GPU (catalog canonical name). First match wins; sizes that match nothing
# (AMD MI300X, fractional vGPU sizes) are skipped and reported.
GPU_BY_SIZE: tuple[tuple[str, str], ...] = (
    (r"^Standard_ND96isr_H200_v5$", "H200"),
    (r"^Standard_ND96isr_H100_v5$", "H100"),
    (r"^Standard_NC\d+ad[i]?s_H100_v5$", "H100-NVL"),
    (r"^Standard_ND96asr_v4$", "A100-40GB"),
    (r"^Standard_ND96amsr_A100_v4$", "A100-80GB"),
    (r"^Standard_NC\d+ads_A100_v4$", "A100-80GB"),
    (r"^Standard_NC\d+as_T4_v3$", "T4"),
    (r"^Standard_NV(36|72)ad[m]?s_A10_v5$", "A10"),
    (r"^Standard_NV\d+s_v3$", "M60"),
    (r"^Standard_NC\d+s_v3$", "V100"),
    (r"^Standard_NC\d+r?$", "K80"),
)


def gpu_for_size(name: str) -> str | None:
    return next((gpu for pattern, gpu in GPU_BY_SIZE if re.match(pattern, name)), None)


def fetch_offerings(ctx: FetchContext) -> FetchResult:
    """GPU sizes per region from Resource SKUs, priced from the Retail Prices API."""
    sizes, problems = _gpu_sizes(ctx)
    wanted = set(ctx.regions) if ctx.regions is not None else None
    ctx.progress(f"{len(sizes)} GPU sizes from Resource SKUs")
    prices = _retail_prices(sorted(sizes), ctx)
    rows: list[Offering] = []
    regions: set[str] = set()
    for name, (gpu, count, vcpus, memory, arch, locations) in sorted(sizes.items()):
        for region in sorted(locations):
            if wanted is not None and region not in wanted:
                continue
            regions.add(region)
            on_demand, spot = prices.get((name, region), (None, None))
            if on_demand is None:
                problems.append(f"{region}: {name} has no Linux on-demand retail price; left out")
                continue
            rows.append(
                Offering(
                    cloud=CLOUD,
                    instance_type=name,
                    gpu=gpu,
                    gpu_count=count,
                    vcpus=vcpus,
                    memory_gib=memory,
                    arch=arch,
                    region=region,
                    price_per_hour=on_demand,
                    spot_price_per_hour=spot if spot is not None and not spot > on_demand else None,
                    status="active",
                    status_date=ctx.fetched_at[:10],
                    status_basis="observed",
                    source=f"{SOURCE} [S]" + ("" if spot else "; spot unknown: no spot retail price"),
                    price_date=ctx.fetched_at,
                )
            )
    ctx.progress(f"{len(rows)} GPU offerings in {len(regions)} regions")
    return FetchResult(rows=rows, regions=regions, source=SOURCE, problems=problems)


PRICES_SOURCE = "Azure Retail Prices API (Consumption, Linux; public, no sign-in)"


def fetch_prices(ctx: FetchContext) -> FetchResult:
    """Without Azure credentials: the sizes already in the catalog, priced from the public Retail
    Prices API in their regions and in every other region where it has a Linux price for them. A
    size with no retail price keeps its previous price, marked old."""
    sold = [o for o in ctx.catalog.offerings if o.cloud == CLOUD and o.status != "retired"]
    known = [o for o in sold if ctx.regions is None or o.region in ctx.regions]
    if not sold:
        raise SourceUnavailable("no Azure sizes in the catalog to price")
    ctx.progress(f"{len({o.instance_type for o in sold})} known sizes (Resource SKUs need credentials)")
    prices = _retail_prices(sorted({o.instance_type for o in sold}), ctx)
    rows: list[Offering] = []
    problems: list[str] = []
    for o in known:
        on_demand, spot = prices.get((o.instance_type, o.region), (None, None))
        if on_demand is None:
            problems.append(
                f"{o.region}: {o.instance_type} has no Linux retail price; its previous price kept, marked old"
            )
            mark = f"{OLD_PRICE_MARK} no retail price on {ctx.fetched_at}, price of {o.price_date} kept] "
            rows.append(o if OLD_PRICE_MARK in o.source else o._replace(source=mark + o.source))
            continue
        rows.append(
            o._replace(
                price_per_hour=on_demand,
                spot_price_per_hour=spot if spot is not None and not spot > on_demand else None,
                source=f"{PRICES_SOURCE} [S]; size and regions from the previous catalog",
                price_date=ctx.fetched_at,
            )
        )
    added = _priced_elsewhere(sold, prices, ctx)
    if added:
        ctx.progress(
            f"{len(added)} rows in {len({o.region for o in added})} regions the catalog lacked, from their prices"
        )
    rows += added
    return FetchResult(rows=rows, regions={o.region for o in rows}, source=PRICES_SOURCE, problems=problems)


SOLD_BY_PRICE = (
    "; sold in this region by its retail price (a Linux on-demand price there is taken as sold there, "
    "as for the shipped rows; whether this subscription may use it needs Resource SKUs, i.e. credentials); "
    "size from the previous catalog"
)


def _priced_elsewhere(
    known: list[Offering], prices: dict[tuple[str, str], tuple[float | None, float | None]], ctx: FetchContext
) -> list[Offering]:
    """The known sizes in every other region where the Retail Prices API has a Linux on-demand price
    for them (the queries are per size, so they answer every region at once): without credentials,
    the catalog learns the regions outside those it shipped with (Europe, Asia, ...)."""
    template = {o.instance_type: o for o in known}
    have = {(o.instance_type, o.region) for o in known}
    out: list[Offering] = []
    for (size, region), (on_demand, spot) in sorted(prices.items()):
        if size not in template or (size, region) in have or on_demand is None:
            continue
        if ctx.regions is not None and region not in ctx.regions:
            continue
        out.append(
            template[size]._replace(
                region=region,
                price_per_hour=on_demand,
                spot_price_per_hour=spot if spot is not None and not spot > on_demand else None,
                status="active",
                status_date=ctx.fetched_at[:10],
                status_basis="observed",
                source=f"{PRICES_SOURCE} [S]{SOLD_BY_PRICE}",
                price_date=ctx.fetched_at,
            )
        )
    return out


def _gpu_sizes(ctx: FetchContext) -> tuple[dict[str, tuple[str, int, int, float, str, set[str]]], list[str]]:
    from azure.core.exceptions import AzureError

    from gpucloud.providers.azure import AzureProvider

    provider = AzureProvider()
    try:
        skus = [
            sku
            for page in ctx.pages(
                provider.compute.resource_skus.list().by_page(), f"Resource SKUs at {provider.arm_endpoint}"
            )
            for sku in page
        ]
    except (AzureError, Exception) as exc:  # noqa: BLE001 - credential errors are not AzureErrors
        raise SourceUnavailable(f"Resource SKUs at {provider.arm_endpoint}: {_first_line(exc)}") from None
    sizes: dict[str, tuple[str, int, int, float, str, set[str]]] = {}
    unknown: set[str] = set()
    for sku in skus:
        if sku.resource_type != "virtualMachines":
            continue
        caps = {c.name: c.value for c in sku.capabilities or []}
        count = int(float(caps.get("GPUs", "0") or 0))
        if count < 1:
            continue
        gpu = gpu_for_size(sku.name)
        if gpu is None or gpu not in ctx.catalog.gpus:
            unknown.add(sku.name)
            continue
        blocked = {
            loc.lower()
            for r in sku.restrictions or []
            if r.type == "Location"
            for loc in (r.restriction_info.locations if r.restriction_info else r.values) or []
        }
        locations = {loc.lower() for loc in sku.locations or []} - blocked
        if sku.name in sizes:
            locations |= sizes[sku.name][5]
        arch = "arm64" if str(caps.get("CpuArchitectureType", "x64")).lower() == "arm64" else "x86_64"
        sizes[sku.name] = (gpu, count, int(caps.get("vCPUs", "0")), float(caps.get("MemoryGB", "0")), arch, locations)
    problems = [f"GPU sizes with no entry in the size table, skipped: {', '.join(sorted(unknown))}"] if unknown else []
    return sizes, problems


def _retail_prices(names: list[str], ctx: FetchContext) -> dict[tuple[str, str], tuple[float | None, float | None]]:
    """(size, region) -> (on-demand, spot) from the Retail Prices API, cheapest row of each kind."""
    base = os.environ.get(PRICES_URL_ENV) or DEFAULT_PRICES_URL
    out: dict[tuple[str, str], list[float | None]] = {}
    for i in range(0, len(names), SKUS_PER_QUERY):
        chunk = names[i : i + SKUS_PER_QUERY]
        sku_filter = " or ".join(f"armSkuName eq '{n}'" for n in chunk)
        flt = f"serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and ({sku_filter})"
        for doc in ctx.pages(
            _documents(f"{base}?{urllib.parse.urlencode({'$filter': flt})}", ctx),
            f"Retail Prices API at {_where(base)}",
        ):
            for item in doc.get("Items", []):
                _add_price(out, item)
        ctx.progress(f"retail prices: {min(i + SKUS_PER_QUERY, len(names))}/{len(names)} sizes")
    return {k: (v[0], v[1]) for k, v in out.items()}


# Windows prices (licence included): product names end in " Windows" or, for some series, " Win".
_WINDOWS = re.compile(r"\bWin(dows)?\b")


def _add_price(out: dict[tuple[str, str], list[float | None]], item: dict[str, Any]) -> None:
    sku_name = str(item.get("skuName", ""))
    if _WINDOWS.search(str(item.get("productName", ""))) or sku_name.endswith("Low Priority"):
        return
    if item.get("unitOfMeasure") != "1 Hour" or item.get("type", "Consumption") != "Consumption":
        return
    price = parse_price(item.get("retailPrice"))
    if price == 0:  # a free meter (credits, promotions) is no price; NaN, inf, negatives go on to the check
        return
    slot = out.setdefault((item["armSkuName"], str(item["armRegionName"]).lower()), [None, None])
    idx = 1 if sku_name.endswith("Spot") else 0
    slot[idx] = cheaper(slot[idx], price)


def _documents(url: str | None, ctx: FetchContext) -> Iterator[dict[str, Any]]:
    """The pages of one query, following NextPageLink; each request is bounded in time."""
    while url:
        what = f"Retail Prices API at {_where(url)}"
        doc = ctx.bounded(lambda u=url: _get_json(u), what, REQUEST_S)  # type: ignore[misc]
        yield doc
        link = doc.get("NextPageLink") or None
        url = urllib.parse.quote(link, safe=":/?&=$%'()+,;@") if link else None


def _where(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


def _get_json(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:  # noqa: S310 - https or a configured mirror
            body = resp.read(MAX_PAGE_BYTES + 1)
        if len(body) > MAX_PAGE_BYTES:
            raise ValueError(f"a page larger than {MAX_PAGE_BYTES} bytes")
        doc = json.loads(body)
        if not isinstance(doc, dict):
            raise ValueError("the answer is not a JSON object")
        return doc
    except (OSError, ValueError) as exc:
        raise SourceUnavailable(f"Retail Prices API at {_where(url)}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
