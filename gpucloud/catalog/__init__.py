"""The GPU catalog: GPU models and cloud offerings, loaded from CSV files shipped in the package.

The data lives in `data/gpus.csv` and `data/offerings.csv` so that a price refresh is a data change,
not a code change. `gpucloud catalog refresh` (catalog/refresh.py) writes a newer catalog into a
versioned cache under GPUCLOUD_HOME (catalog/offerings_db.py); when that cache is there and valid it
replaces the shipped offerings, which stay the offline fallback (docs/CATALOG.md). Every row carries
its source and date (docs/CATALOG.md: never present an unconfirmed figure as certain). Loading is
validated row by row, because a silently wrong price or GPU name would make the planner pick the
wrong machine; a bad row is a bug in the shipped data and raises `CatalogError` naming the file and
line.
"""

from __future__ import annotations

import csv
import functools
import io
import re
from dataclasses import dataclass, field, fields, replace
from importlib.resources import files

from gpucloud.catalog.models import GpuModel, Offering, Status, StatusBasis
from gpucloud.catalog.rows import MemoryRows, RowFilter, RowSource
from gpucloud.contract import registry as providers
from gpucloud.errors import InternalError

__all__ = [
    "Catalog",
    "CatalogError",
    "GpuModel",
    "Offering",
    "Status",
    "CatalogMeta",
    "gpu_names",
    "load_catalog",
    "resolve_gpu_name",
]

ARCHES = ("x86_64", "arm64")

STATUSES: tuple[Status, ...] = ("active", "legacy", "retired")
STATUS_BASES: tuple[StatusBasis, ...] = ("announced", "observed")
_GPU_FIELDS = tuple(f.name for f in fields(GpuModel))
_OFFERING_FIELDS = Offering._fields
# "2025-12-20", or as precise as the source is: "2024-06", "2026".
# Refreshed rows carry the fetch time: "2026-12-03T07:00:00Z".
_DATE_RE = re.compile(r"^\d{4}(-\d{2}(-\d{2}(T\d{2}:\d{2}(:\d{2})?Z?)?)?)?$")
# A memory variant: "A100-40GB" is a variant of the family "A100" (dstack's rule: the bare family
# name matches every memory size, the full name exactly one).
_VARIANT_RE = re.compile(r"^(?P<family>.+)-(?P<gb>\d+)GB$")
# Prefixes people type in front of a model name ("NVIDIA A100", "Tesla K80").
_PREFIXES = ("NVIDIA-", "TESLA-")


class CatalogError(InternalError):
    """The shipped catalog data is malformed (exit 70: a bug in the package, not in the job file)."""


def _normalize(name: str) -> str:
    """Upper case, with spaces and underscores as dashes, so "a100 80gb" matches "A100-80GB"."""
    return re.sub(r"[\s_]+", "-", name.strip()).upper()


@dataclass(frozen=True, slots=True)
class CatalogMeta:
    """Where the offerings come from: the shipped CSVs, or a refresh (per cloud: when, from what,
    and what was missing), so that `plan` can say how old its data is."""

    origin: str = "shipped"  # "shipped" | "refreshed"
    created_at: str | None = None  # ISO time the cache was written
    clouds: dict[str, dict[str, object]] = field(default_factory=dict)
    note: str = ""  # why the cache was not used, when it was not


@dataclass(frozen=True, slots=True)
class Catalog:
    """GPU models by canonical name and every offering (all clouds, regions and statuses), read
    through `rows` by filter (catalog/rows.py) or all at once through `offerings`."""

    gpus: dict[str, GpuModel]
    rows: RowSource
    _names: dict[str, str] = field(repr=False)  # normalized name or alias -> canonical name
    families: dict[str, tuple[str, ...]] = field(default_factory=dict)  # "A100" -> variants
    meta: CatalogMeta = field(default_factory=CatalogMeta)

    @property
    def offerings(self) -> tuple[Offering, ...]:
        """Every offering in catalog order (the whole table: the planner reads `rows` by filter)."""
        return self.rows.all()

    def resolve(self, name: str) -> str | None:
        """Canonical name (or family name) for a name or alias in any case ("tesla k80" -> "K80",
        "a100" -> "A100", the family of A100-40GB and A100-80GB), else None."""
        key = _normalize(name)
        candidates = [key, *(key[len(p) :] for p in _PREFIXES if key.startswith(p))]
        for cand in candidates:
            if cand in self.families:
                return cand
            hit = self._names.get(cand)
            if hit:
                return hit
        return None

    def members(self, name: str) -> tuple[str, ...]:
        """Canonical GPU names a resolved name stands for: every variant of a family, else itself."""
        return self.families.get(name, (name,))

    def gpu(self, name: str) -> GpuModel:
        """The GPU model for a canonical name or alias (case-insensitive); KeyError if unknown.
        A family ("A100") gives a model named after the family with its variants' common
        architecture and the smallest memory, so a stack or a message resolved for it is true of
        every variant."""
        canonical = self.resolve(name)
        if canonical is None:
            raise KeyError(f"unknown GPU {name!r}; known: {', '.join(self.gpus)}")
        variants = self.members(canonical)
        if canonical not in self.families:
            return self.gpus[canonical]
        first = self.gpus[variants[0]]
        return replace(
            first,
            name=canonical,
            memory_gib=min(self.gpus[v].memory_gib for v in variants),
            aliases=(),
            source=f"family of {', '.join(variants)} (memory: the smallest)",
        )

    def variant_for(self, name: str, memory_gib: float) -> str | None:
        """The canonical GPU a cloud API means by a model name and per-GPU memory ("A100" with
        40960 MiB -> "A100-40GB"): the family variant with the closest memory; None if unknown."""
        canonical = self.resolve(name)
        if canonical is None:
            return None
        return min(self.members(canonical), key=lambda n: abs(self.gpus[n].memory_gib - memory_gib))

    def query(
        self,
        gpu: str | None = None,
        cloud: str | None = None,
        region: str | None = None,
        include_retired: bool = False,
    ) -> list[Offering]:
        """Offerings matching every given filter, cheapest on-demand first.

        Legacy rows (still launchable, being phased out) are included; retired rows only with
        `include_retired`, so that the planner can explain *why* a GPU is unavailable. `gpu` accepts
        aliases; an unknown GPU raises KeyError rather than silently matching nothing.
        """
        wanted: tuple[str, ...] | None = None
        if gpu is not None:
            self.gpu(gpu)  # KeyError for an unknown name
            wanted = self.members(self.resolve(gpu) or gpu)
        cloud_l = cloud.lower() if cloud is not None else None
        region_l = region.lower() if region is not None else None
        where = RowFilter(
            clouds=frozenset((cloud_l,)) if cloud_l is not None else None,
            gpus=frozenset(wanted) if wanted is not None else None,
        )
        rows = [
            o
            for _, o in self.rows.select(where)
            if (region_l is None or o.region.lower() == region_l) and (include_retired or o.status != "retired")
        ]
        rows.sort(key=lambda o: (o.price_per_hour, o.cloud, o.region, o.instance_type))
        return rows

    def regions(self, cloud: str) -> list[str]:
        """Sorted regions that have at least one row for `cloud` (any status); [] if none."""
        return self.rows.regions(cloud.lower())


def _read(name: str, expected: tuple[str, ...], text: str | None = None) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) pairs of a data file whose header must be exactly `expected`."""
    if text is None:
        text = (files("gpucloud.catalog") / "data" / name).read_text(encoding="utf-8")
    # csv.reader and zip, not DictReader: `plan` reads the shipped offerings (840 rows) on every run
    # without a refreshed cache, and DictReader's per-row work was half of that read.
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if tuple(header or ()) != expected:
        raise CatalogError(f"catalog/data/{name} line 1: header is {header!r}, expected {list(expected)!r}.")
    out = []
    for row in reader:
        if not row:
            continue  # a blank line, skipped as DictReader did
        if len(row) != len(expected):
            raise CatalogError(f"catalog/data/{name} line {reader.line_num}: wrong number of columns.")
        out.append((reader.line_num, dict(zip(expected, [v.strip() for v in row], strict=True))))
    return out


class _Row:
    """Typed access to one CSV row that turns every problem into a CatalogError with file:line."""

    __slots__ = ("file", "line", "row")

    def __init__(self, file: str, line: int, row: dict[str, str]) -> None:
        self.file, self.line, self.row = file, line, row

    def fail(self, column: str, what: str) -> CatalogError:
        return CatalogError(f"catalog/data/{self.file} line {self.line}: {column}: {what}.")

    def text(self, column: str) -> str:
        value = self.row[column]
        if not value:
            raise self.fail(column, "must not be empty")
        return value

    def number(self, column: str, *, optional: bool = False) -> float | None:
        value = self.row[column]
        if not value and optional:
            return None
        try:
            number = float(value)
        except ValueError:
            raise self.fail(column, f"{value!r} is not a number") from None
        if not number > 0:
            raise self.fail(column, f"{value!r} must be greater than 0")
        return number

    def integer(self, column: str) -> int:
        value = self.row[column]
        if not value.isdigit() or int(value) < 1:
            raise self.fail(column, f"{value!r} is not a positive integer")
        return int(value)

    def date(self, column: str) -> str:
        value = self.text(column)
        if not _DATE_RE.match(value):
            raise self.fail(column, f"{value!r} is not an ISO date (YYYY-MM-DD, YYYY-MM or YYYY)")
        return value

    def choice(self, column: str, allowed: tuple[str, ...]) -> str:
        value = self.row[column]
        if value not in allowed:
            raise self.fail(column, f"{value!r} is not one of {', '.join(allowed)}")
        return value


def _load_gpus() -> tuple[dict[str, GpuModel], dict[str, str]]:
    gpus: dict[str, GpuModel] = {}
    names: dict[str, str] = {}
    for line, raw in _read("gpus.csv", _GPU_FIELDS):
        r = _Row("gpus.csv", line, raw)
        name = r.text("name")
        if _normalize(name) != name:
            raise r.fail("name", f"{name!r} must be upper case without spaces")
        cc = r.text("compute_capability")
        if not re.match(r"^\d+\.\d$", cc):
            raise r.fail("compute_capability", f"{cc!r} is not like 3.7")
        aliases = tuple(a.strip() for a in raw["aliases"].split(";") if a.strip())
        for key in (name, *aliases):
            norm = _normalize(key)
            if norm in names:
                raise r.fail("aliases", f"{key!r} already names {names[norm]}")
            names[norm] = name
        gpus[name] = GpuModel(
            name=name,
            architecture=r.text("architecture"),
            compute_capability=cc,
            memory_gib=r.number("memory_gib"),  # type: ignore[arg-type]  # not optional: never None
            fp32_tflops=r.number("fp32_tflops", optional=True),
            fp64_tflops=r.number("fp64_tflops", optional=True),
            bandwidth_gbs=r.number("bandwidth_gbs", optional=True),
            aliases=aliases,
            source=r.text("source"),
        )
    return gpus, names


def _load_offerings(gpus: dict[str, GpuModel], text: str | None = None) -> tuple[Offering, ...]:
    rows: list[Offering] = []
    seen: dict[tuple[str, str, str], int] = {}
    clouds = providers.priced_clouds()
    for line, raw in (
        _read("offerings.csv", _OFFERING_FIELDS, text) if text is not None else _read("offerings.csv", _OFFERING_FIELDS)
    ):
        r = _Row("offerings.csv", line, raw)
        cloud = r.choice("cloud", clouds)
        instance_type = r.text("instance_type")
        region = r.text("region")
        key = (cloud, instance_type, region)
        if key in seen:
            raise r.fail("instance_type", f"{instance_type} in {region} is already on line {seen[key]}")
        seen[key] = line
        gpu = r.text("gpu")
        if gpu not in gpus:
            raise r.fail("gpu", f"{gpu!r} is not a canonical name in gpus.csv")
        rows.append(
            Offering(
                cloud=cloud,
                instance_type=instance_type,
                gpu=gpu,
                gpu_count=r.integer("gpu_count"),
                vcpus=r.integer("vcpus"),
                memory_gib=r.number("memory_gib"),  # type: ignore[arg-type]
                arch=r.choice("arch", ARCHES),
                region=region,
                price_per_hour=r.number("price_per_hour"),  # type: ignore[arg-type]
                spot_price_per_hour=r.number("spot_price_per_hour", optional=True),
                status=r.choice("status", STATUSES),  # type: ignore[arg-type]
                status_date=r.date("status_date"),
                status_basis=r.choice("status_basis", STATUS_BASES),  # type: ignore[arg-type]
                source=r.text("source"),
                price_date=r.date("price_date"),
            )
        )
    return tuple(rows)


def _families(gpus: dict[str, GpuModel]) -> dict[str, tuple[str, ...]]:
    """Family name -> its memory variants, from the canonical names ("A100" -> A100-40GB,
    A100-80GB; "V100" -> V100, V100-32GB: a bare canonical name joins its own family)."""
    out: dict[str, list[str]] = {}
    for name in gpus:
        m = _VARIANT_RE.match(name)
        if m:
            out.setdefault(m["family"], []).append(name)
    for family, variants in out.items():
        if family in gpus:
            variants.insert(0, family)
    return {f: tuple(v) for f, v in out.items() if len(v) > 1}


@functools.cache
def _shipped_gpus() -> tuple[dict[str, GpuModel], dict[str, str]]:
    return _load_gpus()


@functools.cache
def _shipped_offerings() -> tuple[Offering, ...]:
    return _load_offerings(_shipped_gpus()[0])


@functools.cache
def _load(cache_file: str) -> Catalog:
    from gpucloud.catalog import offerings_db

    gpus, names = _shipped_gpus()
    cached = offerings_db.read(cache_file, gpus)
    rows: RowSource
    if isinstance(cached, offerings_db.Cached):
        rows, meta = cached.rows, cached.meta
    else:
        rows, meta = MemoryRows(_shipped_offerings()), CatalogMeta(note=cached or "")
    return Catalog(gpus=gpus, rows=rows, _names=names, families=_families(gpus), meta=meta)


def _clear() -> None:
    _load.cache_clear()
    _shipped_gpus.cache_clear()
    _shipped_offerings.cache_clear()


def load_catalog() -> Catalog:
    """The refreshed catalog from GPUCLOUD_HOME when one is there and valid, else the shipped CSVs;
    parsed once per process and home (the CLI calls this on every plan)."""
    from gpucloud.catalog import offerings_db

    try:
        path = str(offerings_db.cache_file())
    except OSError:  # no usable home directory: the shipped data still plans
        path = ""
    return _load(path)


load_catalog.cache_clear = _clear  # type: ignore[attr-defined]


def forget_refreshed() -> None:
    """Forget the catalogs read from GPUCLOUD_HOME (a refresh has just rewritten the file); the shipped
    CSVs cannot change while the process runs, so they stay parsed (a re-parse is ~25 ms)."""
    _load.cache_clear()


def validate_offerings_text(text: str) -> tuple[Offering, ...]:
    """Parse and validate an offerings.csv text exactly as the shipped file is (the regeneration
    script checks its output with this before replacing the shipped file)."""
    return _load_offerings(_shipped_gpus()[0], text)


def shipped_catalog() -> Catalog:
    """The shipped CSVs only (the base a first refresh starts from)."""
    gpus, names = _shipped_gpus()
    return Catalog(gpus=gpus, rows=MemoryRows(_shipped_offerings()), _names=names, families=_families(gpus))


def resolve_gpu_name(name: str) -> str | None:
    """Canonical GPU name for a name or alias in any case ("k80", "A100", "tesla-k80"), else None."""
    return load_catalog().resolve(name)


def gpu_names() -> list[str]:
    """Canonical GPU names in catalog order (oldest architecture first), for help and "did you mean"."""
    return list(load_catalog().gpus)
