"""Azure side of image choice (issue 13): the GRID driver extension for NVadsA10 v5 / NVv3 VMs.

images.csv names the extension (`NvidiaGpuDriverLinux`) for GRID VMs; the provider adds this ARM
resource next to the VM (a child `extensions` resource, deployed after the VM). The bootstrap
waits for the driver it installs. Source: Azure/azhpc-extensions, Nvidia-GPU-Linux-Resources.json
(docs/STACKS.md section 3).
"""

from __future__ import annotations

EXTENSION_PUBLISHER = "Microsoft.HpcCompute"
EXTENSION_TYPE = "NvidiaGpuDriverLinux"
EXTENSION_VERSION = "1.6"  # docs/STACKS.md: the extension version the audit read
EXTENSION_API = "2024-07-01"


def driver_extension(location: str, extension: str = EXTENSION_TYPE) -> dict[str, object]:
    """The ARM body of PUT .../virtualMachines/<vm>/extensions/<extension>?api-version=EXTENSION_API."""
    return {
        "location": location,
        "properties": {
            "publisher": EXTENSION_PUBLISHER,
            "type": extension,
            "typeHandlerVersion": EXTENSION_VERSION,
            "autoUpgradeMinorVersion": True,
            "settings": {},
        },
    }


def extension_path(resource_group: str, vm_name: str, subscription: str, extension: str = EXTENSION_TYPE) -> str:
    """The ARM path the body above is PUT to."""
    return (f"/subscriptions/{subscription}/resourceGroups/{resource_group}/providers/Microsoft.Compute/"
            f"virtualMachines/{vm_name}/extensions/{extension}?api-version={EXTENSION_API}")
