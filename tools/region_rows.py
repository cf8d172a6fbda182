"""Add the shipped catalog's rows for every region where AWS and Azure sell the GPU types gpucloud
knows, from stored source files (docs/CATALOG.md, "Shipped regions"), without network access.

- AWS, where: the AWS instance-type and per-zone offering data bundled in the installed moto package
  (AWS's own DescribeInstanceTypes / DescribeInstanceTypeOfferings answers), read with the same GPU
  rules as `catalog refresh` (GPU_OVERRIDES, the catalog's memory variants).
- AWS, on-demand price: a `all_gpu_instances.js` file of the public tsaol/aws-gpu repository
  (generated from instances.vantage.sh, which reads the AWS Price List). A (type, region) moto lists
  but the file does not price gets an estimate: the type's us-east-1 price times that region's
  median ratio to us-east-1 over the types priced in both, marked `[estimate: ...]`.
- Azure: a skypilot-catalog `vms.csv` (Azure Retail Prices, as SkyPilot fetched them): a size with a
  price in a region is sold there. Sizes whose GPU the Azure refresh cannot name, and sizes the
  shipped file has only as retired, are left out.

Existing rows are kept; an AWS row for a (type, region) the price file prices gets that price and
source (its observed spot figure and the spot's citation are kept). The result is validated with the
catalog's own loader before the file is replaced.

Usage: python tools/region_rows.py --aws-prices FILE --aws-cite TEXT --aws-date YYYY-MM-DD
       --azure-vms FILE --azure-cite TEXT --azure-date YYYY [--read-date YYYY-MM-DD] [--out PATH]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import statistics
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from gpucloud.catalog import load_catalog, offerings_db, validate_offerings_text  # noqa: E402
from gpucloud.catalog.models import Offering  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "gpucloud" / "catalog" / "data" / "offerings.csv"
HOME = "us-east-1"
SPOT_V8 = "spot: observed, cheapest zone, skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv @00148f2 (2026) [S]"
NO_SPOT = "spot unknown: no observed figure"


def moto_aws() -> tuple[str, dict[str, tuple[str, int, int, float, str]], dict[str, set[str]]]:
    """(moto version, type -> (GPU, count, vCPUs, memory GiB, arch), region -> offered GPU types)."""
    import moto

    from gpucloud.providers.aws.catalog import GPU_OVERRIDES

    cat = load_catalog()
    base = Path(moto.__file__).parent / "ec2" / "resources"
    types: dict[str, tuple[str, int, int, float, str]] = {}
    for name, it in json.loads(gzip.open(base / "instance_types.json.gz").read()).items():
        gpus = (it.get("GpuInfo") or {}).get("Gpus") or []
        override = GPU_OVERRIDES.get(name)
        if override is None and (not gpus or gpus[0].get("Manufacturer") != "NVIDIA" or not gpus[0].get("Count")):
            continue
        g = gpus[0] if gpus else {}
        mem = g.get("MemoryInfo", {}).get("SizeInMiB", 0) / 1024
        gpu, count = override or (cat.variant_for(g["Name"].replace(" ", "-"), mem), g["Count"])
        if gpu is None:
            continue
        arches = it.get("ProcessorInfo", {}).get("SupportedArchitectures", ["x86_64"])
        arch = "arm64" if "arm64" in arches else "x86_64"
        types[name] = (gpu, int(count), int(it["VCpuInfo"]["DefaultVCpus"]), it["MemoryInfo"]["SizeInMiB"] / 1024, arch)
    offered: dict[str, set[str]] = {}
    for path in sorted((base / "instance_type_offerings" / "availability-zone").glob("*.json.gz")):
        region = path.name.split(".")[0]
        names = {r["InstanceType"] for r in json.loads(gzip.open(path).read())} & set(types)
        if names:
            offered[region] = names
    return moto.__version__, types, offered


def aws_prices(path: Path) -> dict[str, dict[str, float]]:
    """type -> region -> on-demand $/h from an all_gpu_instances.js file (a JS array of objects)."""
    text = path.read_text(encoding="utf-8")
    items = json.loads(text[text.index("[") : text.rindex("]") + 1])
    return {i["name"]: {r: float(p["onDemand"]) for r, p in i["pricing"].items() if "onDemand" in p} for i in items}


def region_ratios(prices: dict[str, dict[str, float]], types: set[str]) -> dict[str, tuple[float, int]]:
    """region -> (median price ratio to us-east-1, number of types it is the median of)."""
    by_region: dict[str, list[float]] = {}
    for name in types:
        home = prices.get(name, {}).get(HOME)
        for region, price in prices.get(name, {}).items():
            if home and region != HOME:
                by_region.setdefault(region, []).append(price / home)
    return {r: (statistics.median(v), len(v)) for r, v in by_region.items()}


def _mem(value: float) -> float:
    return int(value) if float(value).is_integer() else round(value, 2)


def aws_rows(args: argparse.Namespace, old: dict[tuple[str, str, str], Offering]) -> tuple[list[Offering], list[str]]:
    """One row per (type, region) moto lists: sourced price, else an estimate; unpriced types reported."""
    version, types, offered = moto_aws()
    prices = aws_prices(args.aws_prices)
    ratios = region_ratios(prices, set(types))
    where = f"moto {version} bundled DescribeInstanceTypeOfferings (AWS's own data, read {args.read_date}) [S]"
    rows: list[Offering] = []
    notes: list[str] = []
    for region in sorted(offered):
        for name in sorted(offered[region]):
            gpu, count, vcpus, mem, arch = types[name]
            prev = old.get(("aws", name, region))
            spot = prev.spot_price_per_hour if prev else None
            if spot is not None and "skypilot" not in prev.source:  # type: ignore[union-attr]
                raise SystemExit(f"{name} {region}: a spot figure without its skypilot citation")
            tail = f"offered in {region}: {where}; {SPOT_V8 if spot is not None else NO_SPOT}"
            price = prices.get(name, {}).get(region)
            home = prices.get(name, {}).get(HOME)
            if price is not None:
                source = f"on-demand: AWS Price List via instances.vantage.sh ({args.aws_cite}) [S]; {tail}"
            elif home is not None and region in ratios:
                ratio, n = ratios[region]
                price = round(home * ratio, 4)
                source = (
                    f"[estimate: on-demand = us-east-1 price {home} x {ratio:.4f}, the median {region}/us-east-1 "
                    f"ratio over the {n} GPU types priced in both ({args.aws_cite})]; {tail}"
                )
            else:
                notes.append(f"aws {name} {region}: no on-demand price in the file in any region; left out")
                continue
            rows.append(
                Offering(
                    "aws", name, gpu, count, vcpus, _mem(mem), arch, region, price, spot,
                    "active", args.read_date, "observed", source, args.aws_date,
                )
            )  # fmt: skip
    return rows, notes


def azure_rows(args: argparse.Namespace, old: dict[tuple[str, str, str], Offering]) -> list[Offering]:
    """One row per priced (size, region) of a size the shipped file has as active."""
    from gpucloud.providers.azure.catalog import gpu_for_size

    shipped: dict[str, Offering] = {}
    for o in old.values():
        if o.cloud == "azure" and (o.instance_type not in shipped or o.status == "active"):
            shipped[o.instance_type] = o
    rows: list[Offering] = []
    with open(args.azure_vms, newline="", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            name, region = r["InstanceType"], r["Region"]
            gpu, ref = gpu_for_size(name), shipped.get(name)
            if gpu is None or not r["Price"] or (ref is not None and ref.status != "active"):
                continue
            price, spot = float(r["Price"]), float(r["SpotPrice"]) if r["SpotPrice"] else None
            has_spot = spot is not None and spot < price  # the file repeats the on-demand price when it has none
            source = f"{args.azure_cite} [S]; " + (
                "spot: SpotPrice of the same file [S]" if has_spot else "spot unknown: the file has no spot figure"
            )
            count, vcpus, mem = (
                (ref.gpu_count, ref.vcpus, ref.memory_gib)
                if ref
                else (int(r["AcceleratorCount"]), int(float(r["vCPUs"])), _mem(float(r["MemoryGiB"])))
            )
            rows.append(
                Offering(
                    "azure", name, gpu, count, vcpus, mem, "x86_64", region, price, spot if has_spot else None,
                    "active", args.azure_date, "observed", source, args.azure_date,
                )
            )  # fmt: skip
    return rows


def merge(old: list[Offering], fresh: list[Offering]) -> tuple[list[Offering], int, int]:
    """Old rows in their order (an AWS row the fresh rows re-price replaced in place; an Azure row
    kept as it is), then the fresh rows for new (cloud, type, region) keys in catalog order."""
    fresh_by = {(o.cloud, o.instance_type, o.region): o for o in fresh}
    out, replaced = [], 0
    for o in old:
        new = fresh_by.pop((o.cloud, o.instance_type, o.region), None)
        if new is not None and o.cloud == "aws":
            out.append(new)
            replaced += 1
        else:
            out.append(o)
    added = sorted(fresh_by.values(), key=lambda o: (o.cloud, o.gpu, o.gpu_count, o.instance_type, o.region))
    return out + added, replaced, len(added)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aws-prices", type=Path, required=True, help="tsaol/aws-gpu data/all_gpu_instances.js")
    parser.add_argument("--aws-cite", required=True, help="how rows cite that file (repository, path, commit, date)")
    parser.add_argument("--aws-date", required=True, help="the file's own date (its 'Last updated' line)")
    parser.add_argument("--azure-vms", type=Path, required=True, help="skypilot-catalog catalogs/vN/azure/vms.csv")
    parser.add_argument("--azure-cite", required=True, help="how rows cite that file")
    parser.add_argument("--azure-date", required=True, help="the file's date, as precise as known")
    parser.add_argument("--read-date", default=date.today().isoformat(), help="the day moto's data was read")
    parser.add_argument("--out", type=Path, default=DATA)
    args = parser.parse_args(argv)
    old_rows = list(validate_offerings_text(DATA.read_text(encoding="utf-8")))
    old = {(o.cloud, o.instance_type, o.region): o for o in old_rows}
    fresh, notes = aws_rows(args, old)
    fresh += azure_rows(args, old)
    rows, replaced, added = merge(old_rows, fresh)
    text = offerings_db.offerings_csv(rows)
    validate_offerings_text(text)
    offerings_db.replace_file(args.out, text)
    for note in notes:
        print(note, file=sys.stderr)
    print(f"wrote {len(rows)} offerings to {args.out}: {replaced} re-priced, {added} added", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
