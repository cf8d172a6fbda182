"""`gpucloud catalog refresh`: rebuild the offerings from the clouds' own APIs, keep what cannot be
fetched, and write the result atomically into the versioned cache (catalog/store.py).

This module never names a cloud. The provider registry says which providers have a refresh source
(`ProviderInfo.catalog_source`, a module path); each source module offers
`fetch_offerings(ctx: FetchContext) -> FetchResult` and raises `SourceUnavailable` when it cannot
deliver anything (no credentials, endpoint down). A partial result (one region or one price source
down) comes back with its problems listed. Rows of a cloud, or of a region, that could not be
fetched are carried over from the catalog in use (the previous cache, else the shipped CSVs), so a
failed refresh never loses data and never leaves a broken cache (docs/CATALOG.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from gpucloud.errors import GpucloudError

if TYPE_CHECKING:
    from gpucloud.catalog import Catalog
    from gpucloud.catalog.models import Offering

Progress = Callable[[str], None]


class SourceUnavailable(Exception):
    """A refresh source could deliver nothing; the message says why and how to fix it."""


class RefreshFailed(GpucloudError):
    """No requested cloud could be refreshed: the cache is left as it was (exit 75, try again)."""

    exit_code = 75


@dataclass
class FetchContext:
    """What a source gets: the regions asked for (None = every enabled region), the catalog (GPU
    names and their variants), the fetch time to stamp on every row, and a progress callback."""

    regions: list[str] | None
    catalog: Catalog
    fetched_at: str
    progress: Progress


@dataclass
class FetchResult:
    """Rows for `regions` (they replace the old rows of those regions) and what is missing."""

    rows: list[Offering]
    regions: set[str]
    source: str
    problems: list[str] = field(default_factory=list)


@dataclass
class RefreshReport:
    path: Path
    total_rows: int
    clouds: dict[str, dict[str, object]]

    @property
    def complete(self) -> bool:
        return all(info.get("refreshed") and not info.get("problems") for info in self.clouds.values())

    def as_json(self) -> dict[str, object]:
        return {"path": str(self.path), "total_rows": self.total_rows, "complete": self.complete,
                "clouds": self.clouds}


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def refreshable_clouds() -> list[str]:
    from gpucloud.providers import REGISTRY

    return [name for name, entry in REGISTRY.items() if entry.catalog_source]


def refresh(clouds: list[str] | None = None, regions: list[str] | None = None,
            progress: Progress | None = None) -> RefreshReport:
    """Fetch every requested cloud, merge with what is kept, write the cache; RefreshFailed when
    nothing at all could be fetched."""
    from gpucloud.catalog import load_catalog, store
    from gpucloud.catalog.prices import check_rows
    from gpucloud.errors import UserError

    say = progress or (lambda _msg: None)
    base = load_catalog()
    known = refreshable_clouds()
    chosen = clouds or known
    for cloud in chosen:
        if cloud not in known:
            raise UserError(f"--cloud {cloud!r}: no catalog refresh source for it.",
                            hint=f"Clouds with one: {', '.join(known)}.")
    fetched_at = now_iso()
    rows: list[Offering] = list(base.offerings)
    meta: dict[str, dict[str, object]] = {c: dict(v) for c, v in base.meta.clouds.items()}
    for cloud in known:
        meta.setdefault(cloud, {"source": "shipped CSV (gpucloud/catalog/data)", "fetched_at": None})
        meta[cloud].update(refreshed=False, problems=[])
    any_ok = False
    for cloud in chosen:
        ctx = FetchContext(regions=regions, catalog=base, fetched_at=fetched_at,
                           progress=lambda msg, c=cloud: say(f"[{c}] {msg}"))
        result, problem = _fetch_one(cloud, ctx)
        if result is None:
            meta[cloud]["problems"] = [f"{problem}; kept the previous {cloud} rows"]
            say(f"[{cloud}] not refreshed: {problem}")
            continue
        result.rows, bad = check_rows(result.rows, f"{cloud} price API")
        for line in bad:
            say(f"[{cloud}] warning: {line}")
        result.problems += bad
        any_ok = True
        rows = _merge(rows, cloud, result)
        meta[cloud].update(refreshed=True, source=result.source, fetched_at=fetched_at, problems=result.problems,
                           regions=sorted(result.regions))
    for cloud in known:
        meta[cloud]["rows"] = sum(1 for o in rows if o.cloud == cloud)
    path = store.cache_file()
    if not any_ok:
        problems = "; ".join(f"{c}: {p}" for c in chosen for p in meta[c]["problems"])  # type: ignore[attr-defined]
        raise RefreshFailed(f"catalog refresh fetched nothing ({problems}). The catalog in use is unchanged.",
                            hint="Fix the credentials or endpoint named above, or retry later.")
    rows.sort(key=lambda o: (o.cloud, o.gpu, o.instance_type, o.region))
    store.write(path, rows, created_at=fetched_at, clouds=meta)
    load_catalog.cache_clear()  # type: ignore[attr-defined]
    return RefreshReport(path=path, total_rows=len(rows), clouds={c: meta[c] for c in known})


def _fetch_one(cloud: str, ctx: FetchContext) -> tuple[FetchResult | None, str]:
    """One source's result, or None and a one-line reason (credentials, endpoint, API error)."""
    from gpucloud.providers import info

    entry = info(cloud)
    if not entry.configured():
        return None, f"no credentials found. {entry.credentials_hint}"
    try:
        module = importlib.import_module(entry.catalog_source or "")
        return module.fetch_offerings(ctx), ""
    except SourceUnavailable as exc:
        return None, str(exc)
    except Exception as exc:  # noqa: BLE001 - one source failing must not stop the others
        first = (str(exc).strip().splitlines() or [""])[0]
        return None, f"{type(exc).__name__}: {first}"


def _merge(rows: list[Offering], cloud: str, result: FetchResult) -> list[Offering]:
    """Replace the cloud's rows in the fetched regions; keep retired rows the API no longer lists
    (the planner explains retired GPUs with them) unless the API lists that type again."""
    fresh = {(o.instance_type, o.region) for o in result.rows}
    kept = [o for o in rows if not (o.cloud == cloud and o.region in result.regions
                                    and (o.status != "retired" or (o.instance_type, o.region) in fresh))]
    return kept + result.rows
