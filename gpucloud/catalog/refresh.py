"""`gpucloud catalog refresh`: rebuild the offerings from the clouds' own APIs, keep what cannot be
fetched, and write the result atomically into the versioned cache (catalog/offerings_db.py).

This module never names a cloud. The provider registry says which providers have a refresh source
(`ProviderInfo.catalog_source`, a module path); each source module offers
`fetch_offerings(ctx: FetchContext) -> FetchResult` and raises `SourceUnavailable` when it cannot
deliver anything (no credentials, endpoint down). A partial result (one region or one price source
down) comes back with its problems listed. Rows of a cloud, or of a region, that could not be
fetched are carried over from the catalog in use (the previous cache, else the shipped CSVs), so a
failed refresh never loses data and never leaves a broken cache (docs/CATALOG.md).
"""

from __future__ import annotations

import functools
import importlib
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from gpucloud.errors import GpucloudError, UserError

if TYPE_CHECKING:
    from gpucloud.catalog import Catalog
    from gpucloud.catalog.models import Offering

Progress = Callable[[str], None]
T = TypeVar("T")
R = TypeVar("R")
# Bounds of a refresh (docs/CATALOG.md, "Bounds"): a read timeout per request does not end a
# server that answers one byte a second, nor a page token that never repeats.
ENV_DEADLINE = "GPUCLOUD_CATALOG_DEADLINE"  # seconds for the whole refresh
ENV_MAX_PAGES = "GPUCLOUD_CATALOG_MAX_PAGES"  # pages per paged listing
DEFAULT_DEADLINE_S = 900.0
DEFAULT_MAX_PAGES = 1000
# What the clouds' SDKs say when a call is refused for want of a permission (not bad credentials).
DENIED_WORDS = ("AccessDenied", "UnauthorizedOperation", "not authorized to perform", "AuthorizationFailed")


class SourceUnavailable(Exception):
    """A refresh source could deliver nothing; the message says why and how to fix it."""


class SourceLimit(SourceUnavailable):
    """A bound of the refresh was reached (deadline, page limit): what was being read is partial."""


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
    deadline: float = field(default_factory=lambda: time.monotonic() + DEFAULT_DEADLINE_S)  # time.monotonic()
    max_pages: int = DEFAULT_MAX_PAGES

    def left(self) -> float:
        """Seconds until the refresh's deadline (negative once passed)."""
        return self.deadline - time.monotonic()

    def pages(self, pages: Iterable[T], what: str) -> Iterator[T]:
        """The pages of one listing, stopped with SourceLimit past the page limit or the deadline."""
        count = 0
        for page in pages:
            count += 1
            if count > self.max_pages:
                raise SourceLimit(
                    f"{what}: more than {self.max_pages} pages (a next-page link that never ends?); "
                    f"stopped there ({ENV_MAX_PAGES})"
                )
            if self.left() <= 0:
                raise SourceLimit(f"{what}: the refresh deadline passed after {count} page(s) ({ENV_DEADLINE})")
            yield page

    def bounded(self, fn: Callable[[], R], what: str, limit_s: float | None = None) -> R:
        """fn() in a daemon thread, given up at the deadline (or after limit_s): a server that
        trickles its answer keeps a socket read alive for ever, which no read timeout ends."""
        wait = self.left() if limit_s is None else min(limit_s, self.left())
        box: queue.Queue[tuple[bool, object]] = queue.Queue()

        def target() -> None:
            try:
                box.put((True, fn()))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                box.put((False, exc))

        threading.Thread(target=target, daemon=True, name=f"gpucloud-refresh {what}"[:60]).start()
        try:
            ok, value = box.get(timeout=max(wait, 0.01))
        except queue.Empty:
            raise SourceLimit(
                f"{what}: no complete answer within {max(wait, 0):.0f} s (the refresh deadline, {ENV_DEADLINE})"
            ) from None
        if not ok:
            raise value  # type: ignore[misc]
        return value  # type: ignore[return-value]

    def map_bounded(self, fn: Callable[[T], R], items: list[T], workers: int) -> list[R | SourceLimit]:
        """fn over items in daemon worker threads; an item not done by the deadline gets a
        SourceLimit instead of a result (no thread is waited for past the deadline)."""
        todo: queue.Queue[tuple[int, T]] = queue.Queue()
        done: queue.Queue[tuple[int, bool, object]] = queue.Queue()
        for pair in enumerate(items):
            todo.put(pair)

        def worker() -> None:
            while self.left() > 0:
                try:
                    index, item = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    done.put((index, True, fn(item)))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    done.put((index, False, exc))

        for _ in range(min(workers, len(items))):
            threading.Thread(target=worker, daemon=True, name="gpucloud-refresh worker").start()
        out: list[R | SourceLimit] = [
            SourceLimit(f"{item}: not finished by the refresh deadline ({ENV_DEADLINE})") for item in items
        ]
        for _ in items:
            try:
                index, ok, value = done.get(timeout=max(self.left(), 0.01))
            except queue.Empty:
                break
            if not ok:
                raise value  # type: ignore[misc]
            out[index] = value  # type: ignore[assignment]
        return out


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
        return {"path": str(self.path), "total_rows": self.total_rows, "complete": self.complete, "clouds": self.clouds}


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def refreshable_clouds() -> list[str]:
    from gpucloud.contract.registry import REGISTRY

    return [name for name, entry in REGISTRY.items() if entry.catalog_source]


def refresh(
    clouds: list[str] | None = None, regions: list[str] | None = None, progress: Progress | None = None
) -> RefreshReport:
    """Fetch every requested cloud, merge with what is kept, write the cache; RefreshFailed when
    nothing at all could be fetched."""
    from gpucloud.catalog import forget_refreshed, load_catalog, offerings_db
    from gpucloud.catalog.prices import check_rows

    say = progress or (lambda _msg: None)
    base = load_catalog()
    known = refreshable_clouds()
    chosen = _chosen(clouds, known)
    fetched_at = now_iso()
    deadline_s, max_pages = _bounds()
    deadline = time.monotonic() + deadline_s
    rows: list[Offering] = list(base.offerings)
    meta = _meta_before(base, known)
    any_ok = False
    for cloud in chosen:
        ctx = FetchContext(
            regions=regions,
            catalog=base,
            fetched_at=fetched_at,
            progress=functools.partial(_say_for, say, cloud),
            deadline=deadline,
            max_pages=max_pages,
        )
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
        meta[cloud].update(
            refreshed=True,
            source=result.source,
            fetched_at=fetched_at,
            problems=result.problems,
            regions=sorted(result.regions),
        )
    for cloud in known:
        meta[cloud]["rows"] = sum(1 for o in rows if o.cloud == cloud)
    path = offerings_db.cache_file()
    if not any_ok:
        problems = "; ".join(f"{c}: {p}" for c in chosen for p in meta[c]["problems"])  # type: ignore[attr-defined]
        raise RefreshFailed(
            f"catalog refresh fetched nothing ({problems}). The catalog in use is unchanged.",
            hint=_refresh_hint(problems),
        )
    rows.sort(key=lambda o: (o.cloud, o.gpu, o.instance_type, o.region))
    offerings_db.write(path, rows, created_at=fetched_at, clouds=meta)
    forget_refreshed()
    return RefreshReport(path=path, total_rows=len(rows), clouds={c: meta[c] for c in known})


def _chosen(clouds: list[str] | None, known: list[str]) -> list[str]:
    """The clouds asked for (every one with a refresh source when none was); one without a source is bad input."""
    for cloud in clouds or known:
        if cloud not in known:
            raise UserError(
                f"--cloud {cloud!r}: no catalog refresh source for it.", hint=f"Clouds with one: {', '.join(known)}."
            )
    return clouds or known


def _meta_before(base: Catalog, known: list[str]) -> dict[str, dict[str, object]]:
    """Each cloud's record as kept, marked not refreshed yet (a cloud never fetched: the shipped CSV)."""
    meta: dict[str, dict[str, object]] = {c: dict(v) for c, v in base.meta.clouds.items()}
    for cloud in known:
        meta.setdefault(cloud, {"source": "shipped CSV (gpucloud/catalog/data)", "fetched_at": None})
        meta[cloud].update(refreshed=False, problems=[])
    return meta


def _refresh_hint(problems: str) -> str:
    """A refused permission is not a credentials or endpoint problem: name what grants it."""
    if any(word in problems for word in DENIED_WORDS):
        return (
            "The credentials lack the permission named above: grant it (on AWS, attach the policy "
            "that `gpucloud iam-policy aws` prints), then refresh again."
        )
    return "Fix the credentials or endpoint named above, or retry later."


def _say_for(say: Callable[[str], None], cloud: str, msg: str) -> None:
    """A fetcher's progress line, prefixed with its cloud."""
    say(f"[{cloud}] {msg}")


def _fetch_one(cloud: str, ctx: FetchContext) -> tuple[FetchResult | None, str]:
    """One source's result, or None and a one-line reason (credentials, endpoint, API error).

    Without credentials, a cloud whose entry names `catalog_prices` (prices of the sizes
    already in the catalog from a public price API) gets its prices refreshed, named with `--cloud`
    or not (a plain refresh and `--cloud NAME` price it alike); what exists where still needs the
    credentials and is kept."""
    from gpucloud.contract.registry import info

    entry = info(cloud)
    if not entry.configured():
        missing = f"no credentials found. {entry.credentials_hint}"
        if not entry.catalog_prices:
            return None, missing
        where, func = entry.catalog_prices.split(":")
        prices_only = getattr(importlib.import_module(where), func)
        try:
            result: FetchResult = ctx.bounded(lambda: prices_only(ctx), f"{cloud} prices")
        except SourceUnavailable as exc:
            return None, f"{missing} Prices alone: {exc}"
        result.problems.insert(
            0, f"{missing} Only the prices of the sizes already known were refreshed (public price API)"
        )
        return result, ""
    try:
        module = importlib.import_module(entry.catalog_source or "")
        return ctx.bounded(lambda: module.fetch_offerings(ctx), f"{cloud} source"), ""
    except SourceUnavailable as exc:
        return None, str(exc)
    except Exception as exc:  # noqa: BLE001 - one source failing must not stop the others
        first = (str(exc).strip().splitlines() or [""])[0]
        return None, f"{type(exc).__name__}: {first}"


def _bounds() -> tuple[float, int]:
    """The refresh's deadline (s) and page limit from the environment (UserError when malformed)."""
    values: list[float] = []
    for name, default in ((ENV_DEADLINE, DEFAULT_DEADLINE_S), (ENV_MAX_PAGES, float(DEFAULT_MAX_PAGES))):
        raw = os.environ.get(name, "").strip()
        try:
            value = float(raw) if raw else default
        except ValueError:
            value = -1.0
        if not 0 < value < float("inf"):
            raise UserError(
                f"{name}={raw!r} is not a positive number.",
                hint=f"Unset it for the default ({default:g}) or give a number (docs/CATALOG.md).",
            )
        values.append(value)
    return values[0], max(int(values[1]), 1)


def _merge(rows: list[Offering], cloud: str, result: FetchResult) -> list[Offering]:
    """Replace the cloud's rows in the fetched regions; keep retired rows the API no longer lists
    (the planner explains retired GPUs with them) unless the API lists that type again."""
    fresh = {(o.instance_type, o.region) for o in result.rows}
    kept = [
        o
        for o in rows
        if not (
            o.cloud == cloud
            and o.region in result.regions
            and (o.status != "retired" or (o.instance_type, o.region) in fresh)
        )
    ]
    return kept + result.rows
