"""Output of the catalog commands: `catalog --json` rows, `gpus` (one row per GPU model) and the
`catalog refresh` report. Tables on stdout, notes on stderr, as the other offline commands do."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpucloud.catalog.prices import price_source

if TYPE_CHECKING:
    from gpucloud.catalog import Catalog
    from gpucloud.catalog.models import Offering
    from gpucloud.catalog.refresh import RefreshReport


def offering_json(o: Offering) -> dict[str, object]:
    """One catalog row for machines, with its source and price date (how far to trust it)."""
    return {
        "cloud": o.cloud,
        "region": o.region,
        "instance_type": o.instance_type,
        "gpu": o.gpu,
        "gpu_count": o.gpu_count,
        "vcpus": o.vcpus,
        "memory_gib": o.memory_gib,
        "arch": o.arch,
        "price_per_hour": o.price_per_hour,
        "spot_price_per_hour": o.spot_price_per_hour,
        "status": o.status,
        "status_date": o.status_date,
        "status_basis": o.status_basis,
        "source": o.source,
        "price_date": o.price_date,
        "price_source": price_source(o).as_json(),
    }


@dataclass(frozen=True)
class GpuSummary:
    """What `gpucloud gpus` shows for one GPU model (SkyPilot's show-gpus)."""

    name: str
    memory_gib: float
    architecture: str
    clouds: tuple[str, ...]
    on_demand: Offering | None  # cheapest on-demand row per GPU-hour (1- and 8-GPU machines compare)
    spot: Offering | None  # cheapest row per GPU-hour with an observed spot price
    retired: tuple[Offering, ...] = ()  # one retired row per cloud and status, when none is live

    def retirement(self) -> str:
        """Why nothing is offered, per cloud, from the rows' status columns: "aws not offered as of
        2026-12-03; azure retired 2023-09-06" (empty when something is offered or nothing ever was)."""
        return "; ".join(f"{o.cloud} {o.status_text()}" for o in self.retired)

    def as_json(self) -> dict[str, object]:
        def where(o: Offering | None, price: float | None) -> dict[str, object] | None:
            if o is None or price is None:
                return None
            return {
                "price_per_hour": price,
                "price_per_gpu_hour": round(price / max(o.gpu_count, 1), 6),
                "cloud": o.cloud,
                "region": o.region,
                "instance_type": o.instance_type,
                "gpu_count": o.gpu_count,
                "price_date": o.price_date,
                "price_source": price_source(o).as_json(),
            }

        return {
            "gpu": self.name,
            "memory_gib": self.memory_gib,
            "architecture": self.architecture,
            "clouds": list(self.clouds),
            "cheapest_on_demand": where(self.on_demand, self.on_demand.price_per_hour if self.on_demand else None),
            "cheapest_spot": where(self.spot, self.spot.spot_price_per_hour if self.spot else None),
            "retired": [
                {"cloud": o.cloud, "status": o.status, "status_date": o.status_date, "status_basis": o.status_basis}
                for o in self.retired
            ],
        }


def gpu_summaries(cat: Catalog) -> list[GpuSummary]:
    """One summary per GPU model in catalog order; offerings that are retired do not count."""
    live: dict[str, list[Offering]] = {}
    gone: dict[str, dict[tuple[str, str], Offering]] = {}
    for o in cat.offerings:
        if o.status != "retired":
            live.setdefault(o.gpu, []).append(o)
        else:
            gone.setdefault(o.gpu, {}).setdefault((o.cloud, o.status_text()), o)
    out = []
    for name, model in cat.gpus.items():
        rows = live.get(name, [])
        spot_rows = [o for o in rows if o.spot_price_per_hour is not None]
        out.append(
            GpuSummary(
                name=name,
                memory_gib=model.memory_gib,
                architecture=model.architecture,
                clouds=tuple(sorted({o.cloud for o in rows})),
                on_demand=min(rows, key=lambda o: (o.price_per_hour / o.gpu_count, o.cloud, o.region), default=None),
                spot=min(
                    spot_rows,
                    key=lambda o: ((o.spot_price_per_hour or 0.0) / o.gpu_count, o.cloud, o.region),
                    default=None,
                ),
                retired=() if rows else tuple(v for _, v in sorted(gone.get(name, {}).items())),
            )
        )
    return out


def print_refresh(report: RefreshReport) -> None:
    """The human summary of a refresh: what was written, per cloud, and what is missing."""
    print(f"catalog written to {report.path}: {report.total_rows} offerings", file=sys.stderr)
    for cloud, info in report.clouds.items():
        state = "refreshed" if info.get("refreshed") else "kept previous data"
        print(
            f"  {cloud}: {state}; {info.get('rows', 0)} rows; source {info.get('source', '-')}; "
            f"fetched {info.get('fetched_at') or '-'}",
            file=sys.stderr,
        )
        problems = info.get("problems")
        for problem in problems if isinstance(problems, list) else []:
            print(f"    missing: {problem}", file=sys.stderr)
