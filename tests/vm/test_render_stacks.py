"""`gpucloud render --agent-config` (the real CLI) for the machines the stack audit named: the job
config shows the image, a driver branch that holds, and on GRID VMs the extension's pinned
driverVersion (docs/STACKS.md); the agent's stack stage, run on that config against the fake apt,
installs the kernel headers and the branch lock before the driver."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpucloud.vm.agent import stack as stack_stage
from tests.support.cli import cli
from tests.support.vm_sim import GPU_NAMES
from tests.vm.conftest import APT, KERNEL, StubVm

REPO = Path(__file__).resolve().parents[2]


def render(tmp_path: Path, gpu: str, cloud: str, region: str, extra: str = "") -> dict[str, Any]:
    """The stack part of the node's job.json."""
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: audit\nresources:\n  cloud: {cloud}\n  regions: [{region}]\n  gpu: {gpu}\n{extra}"
        "stack: {framework: pytorch}\nmax_duration: 1h\nrun: python train.py\n"
    )
    out = cli(
        "render",
        str(job),
        "--agent-config",
        env={**os.environ, "GPUCLOUD_HOME": str(tmp_path / "home")},
        cwd=REPO,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["stack"]


def _apt_driver_stage(tmp_path: Path, cfg: dict[str, Any], branch: str, package: str, image: str) -> None:
    assert cfg["image_name"] == image
    assert cfg["driver_packages"] == [package]
    lock = [f"nvidia-driver-pinning-{branch}"] if int(branch) >= 580 else []
    assert cfg["driver_lock"] == lock
    assert cfg["driver"] == branch
    # headers of the running kernel and the branch lock are in place before the driver's apt-get
    cfg = {**cfg, "framework": "none", "framework_pip": [], "fabric_manager": False}
    vm = StubVm(tmp_path / "vm", stub_env={"STUB_GPU_NAME": GPU_NAMES[cfg["gpu_model"]]})
    stack_stage.run(cfg, vm.env(cfg))
    installs = vm.apt_installs()
    assert installs[0] == APT + " ".join([f"linux-headers-{KERNEL}", *lock]) and installs[1] == APT + package
    assert f"Pin: version {branch}.*" in vm.pins_file().read_text()


def test_v100_on_p3dn_boots_ubuntu_and_pins_r580(tmp_path: Path) -> None:
    cfg = render(tmp_path, "V100-32GB:8", "aws", "us-east-1")
    _apt_driver_stage(tmp_path, cfg, "580", "cuda-drivers-580", "ubuntu-22.04")  # no proprietary Ubuntu DLAMI


def test_t4g_on_g5g_boots_an_arm64_image(tmp_path: Path) -> None:
    cfg = render(tmp_path, "T4G:1", "aws", "us-east-1", "  arch: arm64\n")  # x86_64 is the default
    assert cfg["image_name"] == "dlami-base-oss-arm64" and cfg["repo_arch"] == "sbsa"
    assert cfg["driver_packages"] == ["cuda-drivers-580"]
    assert cfg["driver_lock"] == ["nvidia-driver-pinning-580"]


def test_b200_gets_open_modules_pinned_and_fabric_manager(tmp_path: Path) -> None:
    cfg = render(tmp_path, "B200:8", "aws", "us-east-1")
    assert cfg["image_name"] == "dlami-base-oss"
    assert cfg["driver_packages"] == ["nvidia-open-580"] and cfg["driver_lock"] == ["nvidia-driver-pinning-580"]
    assert cfg["fabric_manager"] is True


@pytest.mark.parametrize(("gpu", "size"), [("M60:1", "Standard_NV12s_v3"), ("A10:1", "Standard_NV36ads_A10_v5")])
def test_grid_vms_wait_for_the_extensions_pinned_driver(tmp_path: Path, gpu: str, size: str) -> None:
    cfg = render(tmp_path, gpu, "azure", "eastus")
    assert cfg["image_name"] == "ubuntu-22.04-grid"
    assert cfg["driver_source"] == "grid" and cfg["extension"] == "NvidiaGpuDriverLinux", size
    assert cfg["extension_driver"] == "535.161", size
    assert cfg["driver_packages"] == []  # never cuda-drivers on GRID: the stage waits for the extension's
    assert cfg["driver_min"] <= 535


def test_p100_is_not_sold_and_says_so(tmp_path: Path) -> None:
    """P100 (Azure NCv2) has no active offering: a clear refusal, no script."""
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: audit\nresources:\n  cloud: azure\n  gpu: P100:1\nstack: {framework: pytorch}\n"
        "max_duration: 1h\nrun: python train.py\n"
    )
    out = cli("render", str(job), env={**os.environ, "GPUCLOUD_HOME": str(tmp_path / "home")}, cwd=REPO, timeout=60)
    assert out.returncode != 0 and "Traceback" not in out.stderr and "P100" in out.stderr, out.stderr
