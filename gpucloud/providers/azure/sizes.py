"""What an Azure VM size supports, as far as gpucloud's VM bodies depend on it: the security type
the NVIDIA driver path works under, accelerated networking on its NIC, and InfiniBand between VMs
(docs/PROVIDERS.md, "Azure security type and fabrics"). Sizes the tables do not name get the
conservative answer (Standard security, no accelerated networking, TCP), which ARM accepts on
every size.

Sources, read 2026-12 (MicrosoftDocs/azure-compute-docs):
- [TL] articles/virtual-machines/trusted-launch.md, "Virtual machines sizes": GPU families NC, ND
  and NV are supported; NDasrA100_v4 and NDm_A100_v4 "currently not supported"; NC (v1), NV (v1)
  and NP "not supported" (no Gen2); HPC (HB, HC, HX) all supported. Managed images are an
  unsupported feature. The note: "Installation of the GRID driver requires Secure Boot to be
  disabled for Linux VMs"; the CUDA driver needs extra (signing) steps under Secure Boot.
- [AN] articles/virtual-machines/sizes/gpu-accelerated/<series>.md, "Feature support":
  Accelerated Networking Supported / Not Supported (the Resource SKUs API says the same as the
  capability `AcceleratedNetworkingEnabled`).
- [IB] articles/virtual-machines/setup-infiniband.md and the series pages: the RDMA-capable sizes
  (an `r` in the size name) have InfiniBand; RDMA between VMs needs them "in the same virtual
  machine scale set or availability set".
"""

from __future__ import annotations

import re
from typing import Any

# Security types (azure-mgmt-compute SecurityTypes).
TRUSTED_LAUNCH = "TrustedLaunch"
STANDARD = "Standard"
# An `image build` builder's job name starts with this (gpucloud/run/bake.py builder_spec): its VM is
# captured as a managed image, which Trusted Launch does not support [TL], so it boots Standard.
BUILDER_NAME_PREFIX = "image-"

# Fabrics a multi-node run's nodes talk over (what `plan` shows).
INFINIBAND = "InfiniBand"
ACCELERATED = "accelerated networking"
TCP = "TCP"

# Size families without Trusted Launch [TL]: no Gen2 at all (NC v1, NC_Promo, NV v1, NP), or
# "currently not supported" (NDasrA100_v4: ND96asr_v4; NDm_A100_v4: ND96amsr_A100_v4).
NO_TRUSTED_LAUNCH = re.compile(
    r"^Standard_(N[CV]\d+r?(_Promo)?|NP\d+s|ND96asr_v4|ND96amsr_A100_v4)$",
    re.IGNORECASE,
)

# Accelerated networking per size family [AN]: (pattern, supported, series page).
ACCELERATED_NETWORKING: tuple[tuple[str, bool, str], ...] = (
    (r"^Standard_NC\d+as_T4_v3$", True, "ncast4v3-series.md"),
    (r"^Standard_NC\d+ads_A100_v4$", True, "nca100v4-series.md"),
    (r"^Standard_NC\d+adi?s_H100_v5$", True, "ncadsh100v5-series.md"),
    (r"^Standard_NC\d+r?s_v3$", False, "ncv3-series.md"),
    (r"^Standard_NC\d+r?(_Promo)?$", False, "nc-series.md (NC v1, retired)"),
    (r"^Standard_ND40rs_v2$", True, "ndv2-series.md"),
    (r"^Standard_ND96asr_v4$", True, "ndasra100v4-series.md"),
    (r"^Standard_ND96amsr_A100_v4$", True, "ndma100v4-series.md"),
    (r"^Standard_ND96isr_H100_v5$", True, "ndh100v5-series.md"),
    (r"^Standard_ND96isr_H200_v5$", True, "nd-h200-v5-series.md"),
    (r"^Standard_NV\d+s_v3$", True, "nvv3-series.md"),
    (r"^Standard_NV\d+adm?s_A10_v5$", True, "nvadsa10v5-series.md"),
    (r"^Standard_H[BCX]\d+[-a-z0-9]*(_v\d)?$", True, "hb/hc/hx series pages"),
)

# InfiniBand between VMs [IB]: the RDMA sizes of the ND and H families gpucloud knows.
INFINIBAND_SIZES = re.compile(
    r"^Standard_(ND40rs_v2|ND96asr_v4|ND96amsr_A100_v4|ND96isr_H100_v5|ND96isr_H200_v5|NC24rs?_v3|NC24r"
    r"|HB\d+r?s(_v[234])?|HB\d+-\d+rs_v[34]|HC44rs|HX\d+rs)$",
    re.IGNORECASE,
)


def accelerated_networking(instance_type: str) -> bool:
    """Whether the size's NIC may carry `enableAcceleratedNetworking: true` (ARM refuses it,
    VMSizeIsNotPermittedToEnableAcceleratedNetworking, on a size without it)."""
    for pattern, supported, _source in ACCELERATED_NETWORKING:
        if re.match(pattern, instance_type, re.IGNORECASE):
            return supported
    return False


def infiniband(instance_type: str) -> bool:
    return bool(INFINIBAND_SIZES.match(instance_type))


def rdma_placement(instance_type: str, spot: bool) -> bool:
    """Whether a multi-node run's VMs go into one availability set, so that InfiniBand works
    between them. Spot VMs cannot join an availability set (ARM: AzureSpotVMNotSupportedInAvailabilitySet,
    azure-compute-docs error-codes-spot.md): a spot run's nodes talk over Ethernet."""
    return infiniband(instance_type) and not spot


def fabric(instance_type: str, spot: bool = False) -> str:
    """Which network a multi-node run's nodes of this size talk over: InfiniBand (placed in one
    availability set), accelerated networking (SR-IOV Ethernet), or plain TCP. What `plan` shows."""
    if rdma_placement(instance_type, spot):
        return INFINIBAND
    if accelerated_networking(instance_type):
        return ACCELERATED
    return TCP


def security_type(instance_type: str, gen1: bool, image_ref: dict[str, str]) -> str:
    """TrustedLaunch where the size and image support it, else Standard. A Gen1 image or size, a
    size family without Trusted Launch, and a managed image (an image resource id: Trusted Launch
    does not support managed images) get Standard."""
    if gen1 or NO_TRUSTED_LAUNCH.match(instance_type) or "id" in image_ref:
        return STANDARD
    if not _gen2_image(image_ref):
        return STANDARD
    return TRUSTED_LAUNCH


def _gen2_image(image_ref: dict[str, str]) -> bool:
    """A marketplace image known to be Gen2 and to boot under Trusted Launch: a `gen2` sku, or
    Canonical's 24.04 `server` (Gen2; `server-gen1` is the Gen1 one). Any other URN (the Azure
    HPC image, whose driver comes preinstalled, or one the job names) gets Standard, which boots
    every image."""
    sku = image_ref.get("sku", "").lower()
    if "gen1" in sku:
        return False
    return "gen2" in sku or (sku == "server" and image_ref.get("publisher", "").lower() == "canonical")


def security_profile(
    instance_type: str, gen1: bool, image_ref: dict[str, str], *, builder: bool = False
) -> dict[str, Any]:
    """The VM's explicit securityProfile. Under Trusted Launch, Secure Boot is off (the NVIDIA
    driver's DKMS modules are unsigned and `modprobe` refuses them under Secure Boot; the GRID
    driver and its extension require Secure Boot off) and the vTPM on. Explicit, so a
    subscription where Trusted Launch is the default does not turn Secure Boot on."""
    kind = STANDARD if builder else security_type(instance_type, gen1, image_ref)
    if kind == STANDARD:
        return {"securityType": STANDARD}
    return {"securityType": TRUSTED_LAUNCH, "uefiSettings": {"secureBootEnabled": False, "vTpmEnabled": True}}
