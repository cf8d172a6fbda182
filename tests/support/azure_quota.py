"""The fake ARM's vCPU quotas: Compute usages per location, and the refusal of a VM that would go
past one (ARM answers 409 QuotaExceeded before anything of the VM exists).

Kept apart from the product's table on purpose: the size -> family names here are written from
Azure's own usage names (`az vm list-usage`), so a wrong entry in gpucloud's table shows as a
quota it cannot find. Usage is counted from the VMs that exist (not deleting) in the location: an
on-demand VM counts against its family and `cores`, a Spot VM against `lowPriorityCores` only.
Limits are generous (DEFAULT_LIMIT) unless a test sets one (`FakeArm.quotas.set`).
"""

from __future__ import annotations

import re
import threading
from typing import Any

DEFAULT_LIMIT = 10000.0
# (size pattern, family usage name, portal name)
SIZES: tuple[tuple[str, str, str], ...] = (
    (r"^standard_nc\d+as_t4_v3$", "standardNCASv3_T4Family", "Standard NCASv3_T4 Family vCPUs"),
    (r"^standard_nc\d+ads_a100_v4$", "StandardNCADSA100v4Family", "Standard NCADS_A100_v4 Family vCPUs"),
    (r"^standard_nc\d+adi?s_h100_v5$", "StandardNCadsH100v5Family", "Standard NCadsH100v5 Family vCPUs"),
    (r"^standard_nd96asr_v4$", "standardNDASv4_A100Family", "Standard NDASv4_A100 Family vCPUs"),
    (r"^standard_nd96amsr_a100_v4$", "StandardNDAMSv4_A100Family", "Standard NDAMSv4_A100 Family vCPUs"),
    (r"^standard_nd96isr_h100_v5$", "standardNDSH100v5Family", "Standard NDSH100v5 Family vCPUs"),
    (r"^standard_nd96isr_h200_v5$", "standardNDISRH200V5Family", "Standard NDISRH200V5 Family vCPUs"),
    (r"^standard_nv\d+adm?s_a10_v5$", "StandardNVADSA10v5Family", "Standard NVADSA10v5 Family vCPUs"),
    (r"^standard_nv\d+s_v3$", "standardNVSv3Family", "Standard NVSv3 Family vCPUs"),
    (r"^standard_nc\d+r?s_v3$", "standardNCSv3Family", "Standard NCSv3 Family vCPUs"),
    (r"^standard_nc\d+r?$", "standardNCFamily", "Standard NC Family vCPUs"),
    (r"^standard_d\d+.*$", "standardDSv5Family", "Standard DSv5 Family vCPUs"),
)
REGIONAL = ("cores", "Total Regional vCPUs")
SPOT = ("lowPriorityCores", "Total Regional Low-priority vCPUs")


def family(size: str) -> tuple[str, str] | None:
    return next(((fam, portal) for p, fam, portal in SIZES if re.match(p, size.lower())), None)


def vcpus(size: str) -> int:
    """An Azure size name's first number is its vCPU count (Standard_NC4as_T4_v3: 4, ND96isr: 96)."""
    m = re.search(r"_[A-Za-z]+?(\d+)", size)
    return int(m[1]) if m else 0


class Quotas:
    """Limits per (location, usage name), lower-case keys."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.limits: dict[tuple[str, str], float] = {}

    def set(self, location: str, name: str, limit: float) -> None:
        with self.lock:
            self.limits[(location.lower(), name.lower())] = float(limit)

    def clear(self) -> None:
        with self.lock:
            self.limits.clear()

    def limit(self, location: str, name: str) -> float:
        with self.lock:
            return self.limits.get((location.lower(), name.lower()), DEFAULT_LIMIT)

    def usages(self, location: str, vms: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """ARM's Usage - List value for one location, given the VMs' bodies."""
        used = _used(location, vms)
        names = [(fam, portal) for _p, fam, portal in SIZES] + [REGIONAL, SPOT]
        return [
            {
                "unit": "Count",
                "currentValue": int(used.get(name.lower(), 0)),
                "limit": int(self.limit(location, name)),
                "name": {"value": name, "localizedValue": portal},
            }
            for name, portal in dict.fromkeys(names)
        ]

    def refusal(self, body: dict[str, Any], vms: list[dict[str, Any]]) -> tuple[str, str] | None:
        """(code, message) when the VM `body` would go past a quota of its location, as ARM says it."""
        location = str(body.get("location", ""))
        size = str(((body.get("properties") or {}).get("hardwareProfile") or {}).get("vmSize", ""))
        spot = (body.get("properties") or {}).get("priority") == "Spot"
        fam = family(size)
        names = [SPOT[0]] if spot else [n for n in ((fam[0] if fam else None), REGIONAL[0]) if n]
        used = _used(location, vms)
        for name in names:
            limit, current, need = self.limit(location, name), used.get(name.lower(), 0.0), vcpus(size)
            if current + need > limit:
                return (
                    "QuotaExceeded",
                    f"Operation could not be completed as it results in exceeding approved {name} Cores quota. "
                    f"Additional details - Deployment Model: Resource Manager, Location: {location}, "
                    f"Current Limit: {limit:g}, Current Usage: {current:g}, Additional Required: {need}, "
                    f"(Minimum) New Limit Required: {current + need:g}.",
                )
        return None


def _used(location: str, vms: list[dict[str, Any]]) -> dict[str, float]:
    used: dict[str, float] = {}
    for body in vms:
        if str(body.get("location", "")).lower() != location.lower():
            continue
        props = body.get("properties") or {}
        size = str((props.get("hardwareProfile") or {}).get("vmSize", ""))
        n = float(vcpus(size))
        if props.get("priority") == "Spot":
            used[SPOT[0].lower()] = used.get(SPOT[0].lower(), 0.0) + n
            continue
        fam = family(size)
        for name in ((fam[0] if fam else None), REGIONAL[0]):
            if name:
                used[name.lower()] = used.get(name.lower(), 0.0) + n
    return used
