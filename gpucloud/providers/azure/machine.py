"""What an Azure VM of a run looks like: its image, SSH key and power state (docs/PROVIDERS.md,
"Azure images")."""

from __future__ import annotations

import os
import re
from typing import Any

from gpucloud.errors import UserError

ADMIN_USER = "gpucloud"  # the VM's login user (password login is never enabled)

UBUNTU_IMAGES: dict[str, tuple[str, str, str, str]] = {
    "20.04": ("Canonical", "0001-com-ubuntu-server-focal", "20_04-lts-gen2", "20_04-lts"),
    "22.04": ("Canonical", "0001-com-ubuntu-server-jammy", "22_04-lts-gen2", "22_04-lts"),
    "24.04": ("Canonical", "ubuntu-24_04-lts", "server", "server-gen1"),
}
# Sizes that boot only Generation 1 images: NC v1 (K80), NC_Promo, NV v1 (M60).
GEN1_ONLY_SIZE = re.compile(r"^Standard_N[CV]\d+r?(_Promo)?$", re.IGNORECASE)


def needs_gen1(instance_type: str, gpu: str) -> bool:
    return gpu.upper() == "K80" or bool(GEN1_ONLY_SIZE.match(instance_type))


def image_reference(image: str, ubuntu_version: str, instance_type: str, gpu: str) -> dict[str, str]:
    """The VM's imageReference: the job's `image:` wins (a URN `publisher:offer:sku:version` or an
    image resource id); otherwise Ubuntu of the stack, Gen1 where the size requires it."""
    if image and image != "auto":
        if image.startswith("/"):
            return {"id": image}
        parts = image.split(":")
        if len(parts) != 4 or not all(parts):
            raise UserError(f"image {image!r} is not an Azure image URN.",
                            hint="Use publisher:offer:sku:version (e.g. Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest) or an image resource id.")
        return dict(zip(("publisher", "offer", "sku", "version"), parts))
    version = ubuntu_version if ubuntu_version in UBUNTU_IMAGES else "22.04"
    publisher, offer, gen2, gen1 = UBUNTU_IMAGES[version]
    return {"publisher": publisher, "offer": offer, "sku": gen1 if needs_gen1(instance_type, gpu) else gen2,
            "version": "latest"}


def throwaway_ssh_key() -> str:
    """The caller's key when SSH is asked for; else a throwaway key nobody holds (Azure requires a
    key when password login is disabled, and password login is never enabled)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def user_ssh_key() -> str:
    home = os.path.expanduser("~/.ssh")
    for name in ("id_ed25519.pub", "id_rsa.pub", "id_ecdsa.pub"):
        path = os.path.join(home, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                return fh.read().strip()
    raise UserError("resources.ssh is true but no public key was found in ~/.ssh (id_ed25519.pub, id_rsa.pub).",
                    hint="Create one with `ssh-keygen -t ed25519`.")


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
