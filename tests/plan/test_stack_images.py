"""Images a VM boots on the clouds: documented images only, the fallback said out loud and of the
instance's own CPU architecture (docs/STACKS.md, section 4)."""

from __future__ import annotations

from gpucloud.plan.images import load_images, resolve_node
from gpucloud.plan.stacks import resolve_stack
from gpucloud.spec.load import StackSpec
from tests.support.moto_server import moto, moto_server  # noqa: F401

REGION = "us-east-1"


def test_only_documented_deep_learning_amis() -> None:
    """No "Base Proprietary ... Ubuntu 22.04" DLAMI exists (the proprietary Base DLAMI is Amazon
    Linux 2, which the bootstrap cannot run): V100/P100/M60 boot Canonical's Ubuntu and install R580."""
    refs = [i.ref for i in load_images() if i.cloud == "aws"]
    assert not any("proprietary" in r for r in refs)
    assert all("/base-oss-nvidia-driver-gpu-ubuntu-22.04/" in r or "/canonical/ubuntu/" in r for r in refs)
    node = resolve_node(resolve_stack("V100", StackSpec(framework="pytorch")), "aws", "p3dn.24xlarge", 8)
    assert node.image is not None and node.image.name == "ubuntu-22.04" and node.driver_source == "apt"
    assert node.driver_packages == ("cuda-drivers-580",) and node.driver_lock == ("nvidia-driver-pinning-580",)


def test_arm64_type_falls_back_to_arm64_ubuntu_and_says_so(moto) -> None:  # noqa: F811
    """g5g (T4G, arm64): its plan boots the arm64 Base OSS DLAMI; where that parameter cannot be read
    the fallback is Canonical's arm64 Ubuntu (`/current/arm64/`), never an x86_64 AMI, and a warning
    names both images."""
    from gpucloud.providers.aws import AwsProvider
    from tests.support.moto_server import seed_ubuntu_images

    ubuntu = seed_ubuntu_images(moto, [REGION])
    node = resolve_node(resolve_stack("T4", StackSpec(framework="pytorch")), "aws", "g5g.xlarge", 1, cpu_arch="arm64")
    assert node.image is not None and node.image.name == "dlami-base-oss-arm64" and node.repo_arch == "sbsa"
    warned: list[str] = []
    ami, _ = AwsProvider(warn=warned.append).resolve_image(
        REGION, "22.04", "auto", node.image, cpu_arch="arm64", warn=warned.append
    )
    assert ami == ubuntu[(REGION, "22.04-arm64")] != ubuntu[(REGION, "22.04")]
    assert len(warned) == 1 and "dlami-base-oss-arm64" in warned[0] and "Ubuntu 22.04 (arm64)" in warned[0]
    # the plain-Ubuntu path of an arm64 instance is arm64 too
    plain = AwsProvider().resolve_image(REGION, "20.04", cpu_arch="arm64")[0]
    assert plain == ubuntu[(REGION, "20.04-arm64")]


def test_azure_hpc_image_only_on_the_sizes_microsoft_lists() -> None:
    """microsoft-dsvm:ubuntu-hpc:2204 is documented for ND40rs_v2, ND96asr_v4, ND96amsr_A100_v4,
    ND96isr_H100_v5, ND96isr_H200_v5 (driver 535): an NC T4/A100/H100 size never boots it."""
    r535 = StackSpec(framework="pytorch", driver="535", cuda="12.2")
    for gpu, size, count in (("A100-40GB", "Standard_ND96asr_v4", 8), ("H100", "Standard_ND96isr_H100_v5", 8)):
        node = resolve_node(resolve_stack(gpu, r535), "azure", size, count)
        assert node.image is not None and node.image.name == "ubuntu-hpc-22.04", size
    for gpu, size, count in (
        ("T4", "Standard_NC4as_T4_v3", 1),
        ("A100-80GB", "Standard_NC24ads_A100_v4", 1),
        ("H100", "Standard_NC40ads_H100_v5", 1),
    ):
        for pins in (r535, StackSpec(framework="pytorch")):
            node = resolve_node(resolve_stack(gpu, pins), "azure", size, count)
            assert node.image is not None and node.image.name == "ubuntu-22.04", (size, pins)


def test_grid_extension_driver_is_pinned_per_size_family() -> None:
    """GRID 17.x is incompatible with NVv3 (M60) and has a CUDA bug on A10: driverVersion is pinned."""
    import pytest

    from gpucloud.errors import UserError
    from gpucloud.providers.azure.machine import driver_extension_body

    for size in ("Standard_NV12s_v3", "Standard_NV36ads_A10_v5", "Standard_NV6ads_A10_v5"):
        body = driver_extension_body("eastus", "NvidiaGpuDriverLinux", {}, size)
        assert body["properties"]["settings"] == {"driverVersion": "535.161"}, size
    with pytest.raises(UserError, match="GRID driver"):
        driver_extension_body("eastus", "NvidiaGpuDriverLinux", {}, "Standard_NV4as_v4")
    # the GRID VM's stack accepts the pinned R535 (CUDA 12.x wheels run on >= 525.60.13)
    for gpu, size in (("A10", "Standard_NV36ads_A10_v5"), ("M60", "Standard_NV12s_v3")):
        node = resolve_node(resolve_stack(gpu, StackSpec(framework="pytorch")), "azure", size, 1)
        assert node.driver_source == "grid" and node.driver_min <= 535 <= node.driver_max, (gpu, node)
