"""resources.disk_gb against the OS disk of the VM's image, before anything of the run is created.

ARM refuses a VM whose `osDisk.diskSizeGB` is below its image's OS disk ("The specified disk size
N GB is smaller than the size of the corresponding disk in the VM image: M GB"), but only at the
VM create, after the group, network and IP were made, and naming neither the job file's field nor
the fix. The image's size is read first: a marketplace image's version (`latest` resolved as the
Azure CLI does, the first of the versions by name descending) has `osDiskImage.sizeInGb` (ARM
answers it, as `az vm image show` prints, beside `sizeInBytes`; the REST spec's model and so the
SDK's leave both out, so it is read from the answer's JSON); a managed
image has `storageProfile.osDisk.diskSizeGB`. Two ARM reads per launch at most (one for a managed
image or a pinned version). A read that fails says nothing about the disk: the launch goes on (ARM
still refuses a disk that is too small).
"""

from __future__ import annotations

import re
from typing import Any

from gpucloud.contract.provider import FatalProvisionError

_MANAGED = re.compile(
    r"^/subscriptions/[^/]+/resourceGroups/([^/]+)/providers/Microsoft\.Compute/images/([^/]+)$", re.IGNORECASE
)


def image_disk_gb(compute: Any, region: str, image: dict[str, str]) -> int | None:
    """The OS disk size (GB) of the image the VM boots from, or None when it cannot be read."""
    try:
        return _read(compute, region, image)
    except Exception:  # noqa: BLE001 - advice only: ARM itself still refuses a disk that is too small
        return None


def _read(compute: Any, region: str, image: dict[str, str]) -> int | None:
    if "id" in image:
        m = _MANAGED.match(image["id"])
        if not m:
            return None
        found = compute.images.get(m[1], m[2])
        os_disk = found.storage_profile.os_disk if found.storage_profile else None
        return int(os_disk.disk_size_gb) if os_disk is not None and os_disk.disk_size_gb else None
    publisher, offer, sku, version = (image[k] for k in ("publisher", "offer", "sku", "version"))
    if version.lower() == "latest":
        versions = compute.virtual_machine_images.list(region, publisher, offer, sku, top=1, orderby="name desc")
        if not versions:
            return None
        version = versions[0].name
    found = compute.virtual_machine_images.get(region, publisher, offer, sku, version)
    os_image = getattr(found, "os_disk_image", None)
    size = os_image.get("sizeInGb") if os_image is not None else None  # not in the SDK's model: raw JSON
    return int(size) if size else None


def check_disk(compute: Any, region: str, image: dict[str, str], disk_gb: int) -> None:
    """A disk_gb below the image's OS disk: refused with the size and the fix, before any create."""
    size = image_disk_gb(compute, region, image)
    if size and disk_gb < size:
        name = image.get("id") or ":".join(image[k] for k in ("publisher", "offer", "sku", "version"))
        raise FatalProvisionError(
            f"resources.disk_gb is {disk_gb} GB, but the image {name} in {region} has a {size} GB OS disk, "
            "and a VM's OS disk cannot be smaller than its image's.",
            code="DiskSmallerThanImage",
            hint=f"Set resources.disk_gb to {size} or more in the job file (or use a smaller image).",
        )
