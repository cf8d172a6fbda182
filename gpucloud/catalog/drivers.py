"""The driver version a cloud's GPU driver extension is pinned to per instance type
(catalog/data/driver_extensions.csv, each row with its source): shipped data the planner shows and
the provider that installs the extension pins, read from one place."""

from __future__ import annotations

import csv
import fnmatch
import functools
import io
from importlib.resources import files


@functools.cache
def _rows() -> tuple[dict[str, str], ...]:
    text = files("gpucloud.catalog").joinpath("data", "driver_extensions.csv").read_text(encoding="utf-8")
    return tuple(csv.DictReader(io.StringIO(text)))


def extension_driver(cloud: str, instance_type: str) -> str:
    """The driver version the cloud's driver extension is pinned to on this instance type; "" where
    none is known."""
    for row in _rows():
        if row["cloud"] == cloud and fnmatch.fnmatch(instance_type.lower(), row["instance_pattern"].lower()):
            return row["driver_version"]
    return ""
