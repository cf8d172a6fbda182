"""Add the shipped catalog's Azure rows for every region where Azure sells a GPU size gpucloud knows,
from a stored copy of Azure's own retail prices, without network access (docs/CATALOG.md, "Shipped
regions").

Source: `pkg/providers/pricing/zz_generated.pricing.go` of Azure/karpenter-provider-azure (Microsoft's
Karpenter provider for AKS). Its generator reads the public Azure Retail Prices API for every public
region (priceType Consumption, USD, serviceName Virtual Machines; Windows products and Low Priority
meters dropped) and writes one Go map per region: ARM size name -> on-demand $/h, with the time it ran
("// generated at ..."). That time is each new row's price date.

Rules (those of `catalog refresh` without credentials, docs/CATALOG.md):
- a size with a price in a region is taken as sold there;
- only sizes whose GPU the Azure refresh names (`gpu_for_size`); GPU count, vCPUs and memory from the
  size's active row in the shipped file, else from SPECS below (sizes the shipped file lacks);
- a size the shipped file has only as retired (NC K80, NCv3 V100) is not added: it stays retired;
- every existing row is kept as it is, except an active row whose on-demand price is an estimate and
  which the file prices: it takes the file's price (its guessed spot figure goes: unknown);
- the file has no spot prices: a new row's spot is unknown.

The result is validated with the catalog's own loader before the file is replaced.

Usage: python tools/azure_rows.py --prices FILE --cite TEXT [--base PATH] [--out PATH]
  FILE: `git show <commit>:pkg/providers/pricing/zz_generated.pricing.go` of Azure/karpenter-provider-azure
  TEXT: how rows cite it (repository, path, commit)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from gpucloud.catalog import offerings_db, validate_offerings_text  # noqa: E402
from gpucloud.catalog.models import Offering  # noqa: E402
from gpucloud.catalog.prices import price_source  # noqa: E402
from gpucloud.providers.azure.catalog import gpu_for_size  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "gpucloud" / "catalog" / "data" / "offerings.csv"
CLOUD = "azure"

# Sizes the shipped file has no row for: (GPU count, vCPUs, memory GiB, where that was read).
SPECS: dict[str, tuple[int, int, float, str]] = {
    "Standard_ND96isr_H200_v5": (
        8,
        96,
        1850,
        "azure-compute-docs nd-h200-v5-series.md @3b74475",
    ),
}

_REGION = re.compile(r'^\s*initialOnDemandPrices\["([a-z0-9]+)"\]\s*=')
_PRICE = re.compile(r'^\s*"([^"]+)":\s*([0-9]+(?:\.[0-9]+)?),\s*$')
_GENERATED = re.compile(r"^// generated at (\d{4}-\d{2}-\d{2})T")


def read_prices(text: str) -> tuple[str, dict[str, dict[str, float]]]:
    """(the day the file was generated, region -> size -> on-demand $/h) from the Go source."""
    generated, region = "", ""
    prices: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if m := _GENERATED.match(line):
            generated = m.group(1)
        elif m := _REGION.match(line):
            region = m.group(1)
            prices.setdefault(region, {})
        elif (m := _PRICE.match(line)) and region:
            prices[region][m.group(1)] = float(m.group(2))
    if not generated or not prices:
        raise SystemExit("not a zz_generated.pricing.go: no '// generated at' line or no region map")
    return generated, prices


def _specs(old: list[Offering]) -> tuple[dict[str, tuple[int, int, float, str]], set[str]]:
    """size -> (GPU count, vCPUs, memory, spec citation) of every size with an active row or in
    SPECS; and the sizes the shipped file has only as retired."""
    specs = {n: s for n, s in SPECS.items()}
    seen: set[str] = set()
    for o in old:
        if o.cloud != CLOUD:
            continue
        seen.add(o.instance_type)
        if o.status == "active":
            specs[o.instance_type] = (o.gpu_count, o.vcpus, o.memory_gib, "")
    return specs, seen - set(specs)


def azure_rows(
    prices: dict[str, dict[str, float]], generated: str, cite: str, old: list[Offering]
) -> tuple[list[Offering], list[str]]:
    """One row per (known size, region) the file prices; and what was left out, with why."""
    specs, retired = _specs(old)
    rows: list[Offering] = []
    unnamed: set[str] = set()
    for region in sorted(prices):
        for name, price in sorted(prices[region].items()):
            if not name.startswith("Standard_N"):
                continue
            gpu = gpu_for_size(name)
            if gpu is None or name in retired or name not in specs:
                unnamed.add(
                    f"{name}: " + ("no GPU name" if gpu is None else "retired" if name in retired else "no specs")
                )
                continue
            count, vcpus, memory, spec_cite = specs[name]
            size = f"; size: {spec_cite} [S]" if spec_cite else ""
            source = (
                f"on-demand: Azure Retail Prices API (Linux) in {cite} [S]; "
                f"sold in this region by its retail price{size}; spot unknown"
            )
            rows.append(
                Offering(
                    CLOUD, name, gpu, count, vcpus, memory, "x86_64", region, price, None,
                    "active", generated, "observed", source, generated,
                )
            )  # fmt: skip
    return rows, [f"azure {n}: left out" for n in sorted(unnamed)]


def merge(old: list[Offering], fresh: list[Offering]) -> tuple[list[Offering], int, int]:
    """Old rows in their order, an estimated active Azure row the fresh rows price replaced in place;
    then the fresh rows for new (size, region) keys in catalog order."""
    fresh_by = {(o.instance_type, o.region): o for o in fresh}
    out, replaced = [], 0
    for o in old:
        new = fresh_by.pop((o.instance_type, o.region), None) if o.cloud == CLOUD else None
        if new is not None and o.status == "active" and price_source(o).kind == "estimate":
            out.append(new)
            replaced += 1
        else:
            out.append(o)
    added = sorted(fresh_by.values(), key=lambda o: (o.gpu, o.gpu_count, o.instance_type, o.region))
    return out + added, replaced, len(added)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prices", type=Path, required=True, help="karpenter-provider-azure zz_generated.pricing.go")
    parser.add_argument("--cite", required=True, help="how rows cite that file (repository, path, commit)")
    parser.add_argument("--base", type=Path, default=DATA, help="the offerings file to add to (default: shipped)")
    parser.add_argument("--out", type=Path, default=DATA)
    args = parser.parse_args(argv)
    old = list(validate_offerings_text(args.base.read_text(encoding="utf-8")))
    generated, prices = read_prices(args.prices.read_text(encoding="utf-8"))
    fresh, notes = azure_rows(prices, generated, args.cite, old)
    rows, replaced, added = merge(old, fresh)
    text = offerings_db.offerings_csv(rows)
    validate_offerings_text(text)
    offerings_db.replace_file(args.out, text)
    for note in notes:
        print(note, file=sys.stderr)
    regions = {o.region for o in rows if o.cloud == CLOUD and o.status == "active"}
    print(
        f"wrote {len(rows)} offerings to {args.out}: {replaced} re-priced, {added} added; "
        f"azure active in {len(regions)} regions",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
