"""The fake ARM's marketplace images: versions of any publisher:offer:sku, each with the OS disk
size a test sets (DEFAULT_GB otherwise: Canonical's Ubuntu server images have 30 GB), and ARM's
refusal of a VM whose OS disk is below its image's (409 OperationNotAllowed, before anything of
the VM exists; the message ARM gives, "The specified disk size ... is smaller than the size of the
corresponding disk in the VM image")."""

from __future__ import annotations

import re
import threading
from typing import Any

DEFAULT_GB = 30
VERSIONS = ("22.04.202411010", "22.04.202412040")  # two, so that `latest` must be resolved
VERSIONS_RE = re.compile(
    r"^/subscriptions/[^/]+/providers/microsoft\.compute/locations/(?P<loc>[^/]+)/publishers/(?P<pub>[^/]+)"
    r"/artifacttypes/vmimage/offers/(?P<offer>[^/]+)/skus/(?P<sku>[^/]+)/versions(?:/(?P<version>[^/]+))?$",
    re.I,
)


class Images:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.disk_gb: dict[str, int] = {}  # "publisher:offer:sku" (lower) -> GB

    def set(self, urn: str, gb: int) -> None:
        """The OS disk size of every version of `publisher:offer:sku`."""
        with self.lock:
            self.disk_gb[urn.lower()] = gb

    def clear(self) -> None:
        with self.lock:
            self.disk_gb.clear()

    def size(self, publisher: str, offer: str, sku: str) -> int:
        with self.lock:
            return self.disk_gb.get(f"{publisher}:{offer}:{sku}".lower(), DEFAULT_GB)

    def answer(self, m: re.Match[str], query: dict[str, str]) -> tuple[int, Any]:
        """VirtualMachineImages - List (by name, `$orderby=name desc` reversed, `$top` applied) or - Get."""
        loc, pub, offer, sku, version = m["loc"], m["pub"], m["offer"], m["sku"], m["version"]
        base = m[0].split("/versions")[0] + "/versions"
        if version is None:
            names = sorted(VERSIONS, reverse=query.get("$orderby", "").lower() == "name desc")
            top = int(query.get("$top") or len(names))
            return 200, [{"location": loc, "name": v, "id": f"{base}/{v}"} for v in names[:top]]
        if version not in VERSIONS:
            return 404, {"error": {"code": "ImageVersionNotFound", "message": "Artifact: VMImage was not found."}}
        return 200, {
            "location": loc,
            "name": version,
            "id": f"{base}/{version}",
            "properties": {
                "hyperVGeneration": "V2",
                "architecture": "x64",
                "osDiskImage": {  # as ARM answers (az vm image show), beyond the REST spec's model
                    "operatingSystem": "Linux",
                    "sizeInBytes": self.size(pub, offer, sku) * 1024**3,
                    "sizeInGb": self.size(pub, offer, sku),
                },
                "dataDiskImages": [],
            },
        }

    def refusal(self, body: dict[str, Any]) -> tuple[str, str] | None:
        """ARM's refusal of a VM whose OS disk is below its marketplace image's."""
        storage = (body.get("properties") or {}).get("storageProfile") or {}
        ref, disk = storage.get("imageReference") or {}, (storage.get("osDisk") or {}).get("diskSizeGB")
        if not disk or "publisher" not in ref:
            return None
        size = self.size(ref["publisher"], ref["offer"], ref["sku"])
        if int(disk) < size:
            return (
                "OperationNotAllowed",
                f"The specified disk size {disk} GB is smaller than the size of the corresponding disk in the "
                f"VM image: {size} GB. This is not allowed. Please choose equal or greater size or do not "
                "specify an explicit size.",
            )
        return None
