"""The refreshed catalog on disk: one versioned pickle under GPUCLOUD_HOME, written atomically.

Why a pickle of plain tuples: `plan` must read tens of thousands of rows (every region of every
cloud) well inside its 0.3 s budget. Parsing and validating a 50k-row CSV takes about a second;
unpickling tuples and building the frozen rows takes a few tens of ms (bench/bench_plan_50k.py,
BENCHMARKS.md). The rows were validated when the refresh built them, so loading only checks the
format version and the GPU names. The directory carries the format version (`catalog/v2/`), so a
newer gpucloud never misreads an older cache: it ignores it and uses the shipped CSVs.
"""

from __future__ import annotations

import gc
import os
import pickle
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpucloud.catalog.models import Offering

if TYPE_CHECKING:
    from gpucloud.catalog import CatalogMeta
    from gpucloud.catalog.models import GpuModel

FORMAT_VERSION = 2
_FIELDS = Offering._fields


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while tens of thousands of rows are built: the rows hold
    no cycles, and every collection would walk all of them again (measured: the rows' build took
    3.5 x longer with the collector running, bench/bench_plan_50k.py)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass(frozen=True)
class Cached:
    offerings: tuple[Offering, ...]
    meta: CatalogMeta


def cache_file() -> Path:
    """$GPUCLOUD_HOME/catalog/v<format>/catalog.pickle"""
    from gpucloud.state import home_dir

    return home_dir() / "catalog" / f"v{FORMAT_VERSION}" / "catalog.pickle"


def read(path: str, gpus: dict[str, GpuModel]) -> Cached | str | None:
    """The cached catalog; None when there is none; a one-line reason when it is unusable (the
    caller falls back to the shipped CSVs and says why)."""
    from gpucloud.catalog import CatalogMeta

    try:
        with open(path, "rb") as fh, gc_paused():
            doc = pickle.load(fh)  # noqa: S301 - our own file in the user's own data directory
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - any damage means "do not use it"
        return f"refreshed catalog {path} is unreadable ({type(exc).__name__}); using the shipped data"
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION or doc.get("fields") != _FIELDS:
        return f"refreshed catalog {path} has another format; using the shipped data (run `gpucloud catalog refresh`)"
    try:
        with gc_paused():
            rows = tuple(map(Offering._make, doc["rows"]))
        if rows and len(rows[0]) != len(_FIELDS):
            raise TypeError("row width")
    except TypeError:
        return f"refreshed catalog {path} has malformed rows; using the shipped data"
    unknown = {o.gpu for o in rows} - set(gpus)
    if unknown:
        return f"refreshed catalog {path} names GPUs this version does not know ({', '.join(sorted(unknown))})"
    meta = CatalogMeta(origin="refreshed", created_at=doc.get("created_at"), clouds=doc.get("clouds", {}))
    return Cached(offerings=rows, meta=meta)


def write(
    path: Path,
    offerings: list[Offering] | tuple[Offering, ...],
    *,
    created_at: str,
    clouds: dict[str, dict[str, object]],
) -> None:
    """Write atomically: a temporary file in the same directory, fsync, then rename over the old
    one, so a crash or a second refresh never leaves a half-written cache for `plan` to read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "version": FORMAT_VERSION,
        "fields": _FIELDS,
        "created_at": created_at,
        "clouds": clouds,
        "rows": [tuple(o) for o in offerings],
    }
    fd, tmp = tempfile.mkstemp(prefix=".catalog-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            pickle.dump(doc, fh, protocol=pickle.HIGHEST_PROTOCOL)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".")
    return str(value)


def offerings_csv(offerings: list[Offering] | tuple[Offering, ...]) -> str:
    """The shipped offerings.csv format (header = Offering's fields), one row per offering."""
    import csv
    import io

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(_FIELDS)
    for o in offerings:
        writer.writerow([_cell(v) for v in o])
    return buf.getvalue()


def replace_file(path: Path, text: str) -> None:
    """Write a text file atomically (temporary file in the same directory, then rename)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
