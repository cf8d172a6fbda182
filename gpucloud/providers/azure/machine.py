"""What an Azure node of a run looks like: its image, SSH key, the ARM bodies of its public IP,
NIC, NSG and VM, and how its power state reads (docs/PROVIDERS.md, "Azure images")."""

from __future__ import annotations

import base64
import re
from typing import TYPE_CHECKING, Any

from gpucloud.catalog.drivers import extension_driver
from gpucloud.contract.provider import LaunchRequest, ssh_source_cidr
from gpucloud.errors import UserError
from gpucloud.providers.azure.sizes import BUILDER_NAME_PREFIX, accelerated_networking, security_profile

if TYPE_CHECKING:
    from gpucloud.contract.provider import Image

ADMIN_USER = "gpucloud"  # the VM's login user (password login is never enabled)
# The run's network: one VNet and one subnet per run; the subnet holds exactly the run's nodes.
VNET_PREFIX = "10.0.0.0/16"
SUBNET_PREFIX = "10.0.0.0/24"

# Ubuntu images on Azure (docs/PROVIDERS.md, "Azure images"): version -> (publisher, offer, Gen2 sku, Gen1 sku).
UBUNTU_IMAGES: dict[str, tuple[str, str, str, str]] = {
    "20.04": ("Canonical", "0001-com-ubuntu-server-focal", "20_04-lts-gen2", "20_04-lts"),
    "22.04": ("Canonical", "0001-com-ubuntu-server-jammy", "22_04-lts-gen2", "22_04-lts"),
    "24.04": ("Canonical", "ubuntu-24_04-lts", "server", "server-gen1"),
}
# Sizes that boot only Generation 1 images: NC v1 (K80), NC_Promo, NV v1 (M60).
GEN1_ONLY_SIZE = re.compile(r"^Standard_N[CV]\d+r?(_Promo)?$", re.IGNORECASE)


def needs_gen1(instance_type: str, gpu: str) -> bool:
    return gpu.upper() == "K80" or bool(GEN1_ONLY_SIZE.match(instance_type))


# NVIDIA's GRID driver for NVadsA10 v5 / NVv3 VMs comes from this VM extension (docs/STACKS.md,
# section 3; Azure/azhpc-extensions Nvidia-GPU-Linux-Resources.json): images.csv names it.
EXTENSION_PUBLISHER = "Microsoft.HpcCompute"
EXTENSION_VERSION = "1.6"  # docs/STACKS.md: the extension version the audit read


def image_reference(
    image: str, ubuntu_version: str, instance_type: str, gpu: str, chosen: Image | None = None
) -> dict[str, str]:
    """The VM's imageReference: the job's `image:` wins (a URN `publisher:offer:sku:version` or an
    image resource id); then the plan's image (`chosen`: a baked image's id, or a vendor image's
    URN where the size boots Gen2); otherwise Ubuntu of the stack, Gen1 where the size requires it."""
    if (not image or image == "auto") and chosen is not None:
        if chosen.found_by == "baked":
            image = chosen.ref
        elif (
            chosen.found_by == "urn"
            and chosen.vendor
            and chosen.modules != "grid"
            and not needs_gen1(instance_type, gpu)
        ):
            image = chosen.ref
    if image and image != "auto":
        if image.startswith("/"):
            return {"id": image}
        parts = image.split(":")
        if len(parts) != 4 or not all(parts):
            raise UserError(
                f"image {image!r} is not an Azure image URN.",
                hint="Use publisher:offer:sku:version (e.g. "
                "Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest) or an image resource id.",
            )
        return dict(zip(("publisher", "offer", "sku", "version"), parts, strict=True))
    version = ubuntu_version if ubuntu_version in UBUNTU_IMAGES else "22.04"
    publisher, offer, gen2, gen1 = UBUNTU_IMAGES[version]
    return {
        "publisher": publisher,
        "offer": offer,
        "sku": gen1 if needs_gen1(instance_type, gpu) else gen2,
        "version": "latest",
    }


def grid_driver_version(instance_type: str) -> str:
    """The driverVersion the extension is pinned to on this size (catalog/data/driver_extensions.csv:
    GRID 17.x is incompatible with NVv3 and has a CUDA bug on A10, per Microsoft's extension page);
    a GRID size without a documented pin is refused."""
    version = extension_driver("azure", instance_type)
    if not version:
        raise UserError(
            f"{instance_type} needs NVIDIA's GRID driver from the NvidiaGpuDriverLinux extension, but "
            "gpucloud knows no driver version that is documented to work on it.",
            hint="Choose an NVadsA10 v5 or NVv3 size, or another GPU.",
        )
    return version


def driver_extension_body(location: str, extension: str, tags: dict[str, str], instance_type: str) -> dict[str, Any]:
    """The ARM body of the VM extension that installs the GPU driver (child resource
    .../virtualMachines/<vm>/extensions/<extension>, created once the VM exists), its GRID driver
    pinned for the size. The extension may reboot the VM; the bootstrap resumes (docs/STACKS.md)."""
    return {
        "location": location,
        "tags": tags,
        "properties": {
            "publisher": EXTENSION_PUBLISHER,
            "type": extension,
            "typeHandlerVersion": EXTENSION_VERSION,
            "autoUpgradeMinorVersion": True,
            "settings": {"driverVersion": grid_driver_version(instance_type)},
        },
    }


def throwaway_ssh_key() -> str:
    """A key nobody holds, for a run that asked for no session (Azure requires a key when password
    login is disabled, and password login is never enabled); ssh_session.py makes the run's own."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def vm_state(vm: Any) -> str:
    props = vm.properties
    view = getattr(props, "instance_view", None) if props is not None else None
    statuses = [s.code or "" for s in (getattr(view, "statuses", None) or [])]
    power = next((c.split("/", 1)[1] for c in statuses if c.startswith("PowerState/")), None)
    provisioning = (getattr(props, "provisioning_state", None) or "").lower()
    if provisioning == "deleting":
        return "stopping"
    if power is None:
        return "gone" if provisioning == "failed" else "pending"
    if power in ("running",):
        return "running"
    if power in ("starting",):
        return "pending"
    return "stopping"  # stopping, stopped (still billed), deallocating, deallocated


def pip_body(req: LaunchRequest, tags: dict[str, str]) -> dict[str, Any]:
    return {
        "location": req.region,
        "tags": tags,
        "sku": {"name": "Standard", "tier": "Regional"},
        "properties": {"publicIPAllocationMethod": "Static", "publicIPAddressVersion": "IPv4"},
    }


def nic_body(req: LaunchRequest, tags: dict[str, str], nsg_id: str, subnet_id: str, pip_id: str) -> dict[str, Any]:
    """The node's NIC, with accelerated networking (SR-IOV) where the size supports it (sizes.py):
    NCCL's TCP path and every download go through it."""
    return {
        "location": req.region,
        "tags": tags,
        "properties": {
            "enableAcceleratedNetworking": accelerated_networking(req.instance_type),
            "networkSecurityGroup": {"id": nsg_id},
            "ipConfigurations": [
                {
                    "name": "ipconfig",
                    "properties": {
                        "subnet": {"id": subnet_id},
                        "privateIPAllocationMethod": "Dynamic",
                        "publicIPAddress": {"id": pip_id},
                    },
                }
            ],
        },
    }


def nsg_body(req: LaunchRequest, region: str, tags: dict[str, str]) -> dict[str, Any]:
    """Inbound: nothing from anywhere, except node-to-node within the run's subnet for
    multi-node jobs and SSH from the caller's address when the job asks for it."""
    rules: list[dict[str, Any]] = [
        {
            "name": "deny-all-inbound",
            "properties": {
                "priority": 4096,
                "direction": "Inbound",
                "access": "Deny",
                "protocol": "*",
                "sourceAddressPrefix": "*",
                "sourcePortRange": "*",
                "destinationAddressPrefix": "*",
                "destinationPortRange": "*",
            },
        }
    ]
    if len(req.user_data) > 1:
        # The run's own nodes, and only them: the subnet is the run's (not the VirtualNetwork
        # tag, which also covers peered networks, gateways and the host's 168.63.129.16).
        rules.append(
            {
                "name": "allow-run-nodes-inbound",
                "properties": {
                    "priority": 4000,
                    "direction": "Inbound",
                    "access": "Allow",
                    "protocol": "*",
                    "sourceAddressPrefix": SUBNET_PREFIX,
                    "sourcePortRange": "*",
                    "destinationAddressPrefix": SUBNET_PREFIX,
                    "destinationPortRange": "*",
                },
            }
        )
    if req.ssh:
        rules.append(
            {
                "name": "allow-ssh-from-caller",
                "properties": {
                    "priority": 1000,
                    "direction": "Inbound",
                    "access": "Allow",
                    "protocol": "Tcp",
                    "sourceAddressPrefix": ssh_source_cidr(),
                    "sourcePortRange": "*",
                    "destinationAddressPrefix": "*",
                    "destinationPortRange": "22",
                },
            }
        )
    return {"location": region, "tags": tags, "properties": {"securityRules": rules}}


def _os_profile(computer_name: str, script: str, ssh_key: str) -> dict[str, Any]:
    """The login: key only (no password), and the user-data script as the VM's custom data."""
    return {
        "computerName": computer_name,
        "adminUsername": ADMIN_USER,
        "customData": base64.b64encode(script.encode()).decode(),
        "linuxConfiguration": {
            "disablePasswordAuthentication": True,
            "ssh": {"publicKeys": [{"path": f"/home/{ADMIN_USER}/.ssh/authorized_keys", "keyData": ssh_key}]},
        },
    }


def vm_body(
    req: LaunchRequest,
    rank: int,
    script: str,
    nic_id: str,
    region: str,
    tags: dict[str, str],
    ssh_key: str,
    ppg_id: str | None = None,
    avset_id: str | None = None,
) -> dict[str, Any]:
    """The VM: its image, disk, login, NIC, an explicit security type (sizes.py) and, for a
    multi-node run, its placement (the proximity placement group; on InfiniBand sizes also the
    availability set that RDMA between VMs requires)."""
    image = image_reference(req.image_ref, req.ubuntu, req.instance_type, req.gpu, req.image)
    props: dict[str, Any] = {
        "hardwareProfile": {"vmSize": req.instance_type},
        "securityProfile": security_profile(
            req.instance_type,
            needs_gen1(req.instance_type, req.gpu),
            image,
            builder=req.job_name.startswith(BUILDER_NAME_PREFIX),
        ),
        "storageProfile": {
            "imageReference": image,
            "osDisk": {
                "name": f"osdisk-{rank}",
                "createOption": "FromImage",
                "deleteOption": "Delete",
                "diskSizeGB": req.disk_gb,
                "managedDisk": {"storageAccountType": "StandardSSD_LRS"},
            },
        },
        "osProfile": _os_profile(f"{req.job_name}-{rank}"[:63], script, ssh_key),
        "networkProfile": {
            "networkInterfaces": [{"id": nic_id, "properties": {"primary": True, "deleteOption": "Delete"}}]
        },
        # Serial console log in managed storage (no account needed): what `console_hint` points to.
        "diagnosticsProfile": {"bootDiagnostics": {"enabled": True}},
    }
    if ppg_id:
        props["proximityPlacementGroup"] = {"id": ppg_id}
    if avset_id:
        props["availabilitySet"] = {"id": avset_id}
    if req.spot:
        max_price = req.max_price_per_hour
        props.update(
            {
                "priority": "Spot",
                "evictionPolicy": "Delete",
                "billingProfile": {"maxPrice": float(max_price) if max_price else -1},
            }
        )
    return {"location": region, "tags": tags, "identity": {"type": "SystemAssigned"}, "properties": props}
