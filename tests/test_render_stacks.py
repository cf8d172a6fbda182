"""`gpucloud render` (the real CLI) for the machines the stack audit named: the user-data shows the
image, the kernel headers before the driver, a driver branch that holds, and on GRID VMs the
extension's pinned driverVersion (docs/STACKS.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def render(tmp_path: Path, gpu: str, cloud: str, region: str, extra: str = "") -> str:
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: audit\nresources:\n  cloud: {cloud}\n  regions: [{region}]\n  gpu: {gpu}\n{extra}"
        "stack: {framework: pytorch}\nmax_duration: 1h\nrun: python train.py\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "gpucloud", "render", str(job)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "GPUCLOUD_HOME": str(tmp_path / "home")},
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _array(script: str, name: str) -> list[str]:
    m = re.search(rf"^{name}=\((.*)\)$", script, re.MULTILINE)
    assert m, name
    return m.group(1).replace("'", "").split()


def _apt_driver_stage(script: str, branch: str, package: str, image: str) -> None:
    assert f"# image: {image}\n" in script
    assert _array(script, "DRV_PKGS") == [package]
    assert _array(script, "DRV_LOCK") == ([f"nvidia-driver-pinning-{branch}"] if int(branch) >= 580 else [])
    assert f"DRIVER='{branch}'\n" in script
    # headers of the running kernel and the branch lock are in place before the driver's apt-get
    lock = script.index('drv_lock && apt_install "${miss[@]}"')
    body = script[script.index("drv_lock() {") :]
    assert 'apt_install "linux-headers-$(uname -r)" "${DRV_LOCK[@]}"' in body and lock > 0
    assert "Pin: version %s.*" in body


def test_v100_on_p3dn_boots_ubuntu_and_pins_r580(tmp_path: Path) -> None:
    script = render(tmp_path, "V100-32GB:8", "aws", "us-east-1")
    _apt_driver_stage(script, "580", "cuda-drivers-580", "ubuntu-22.04")  # no proprietary Ubuntu DLAMI exists


def test_t4g_on_g5g_boots_an_arm64_image(tmp_path: Path) -> None:
    script = render(tmp_path, "T4G:1", "aws", "us-east-1")
    assert "# image: dlami-base-oss-arm64\n" in script and "REPO_ARCH='sbsa'\n" in script
    assert _array(script, "DRV_PKGS") == ["cuda-drivers-580"]
    assert _array(script, "DRV_LOCK") == ["nvidia-driver-pinning-580"]


def test_b200_gets_open_modules_pinned_and_fabric_manager(tmp_path: Path) -> None:
    script = render(tmp_path, "B200:8", "aws", "us-east-1")
    assert "# image: dlami-base-oss\n" in script
    assert _array(script, "DRV_PKGS") == ["nvidia-open-580"] and _array(script, "DRV_LOCK") == [
        "nvidia-driver-pinning-580"
    ]
    assert "nvidia-fabricmanager" in script


@pytest.mark.parametrize(("gpu", "size"), [("M60:1", "Standard_NV12s_v3"), ("A10:1", "Standard_NV36ads_A10_v5")])
def test_grid_vms_wait_for_the_extensions_pinned_driver(tmp_path: Path, gpu: str, size: str) -> None:
    script = render(tmp_path, gpu, "azure", "eastus")
    assert "# image: ubuntu-22.04-grid\n" in script
    assert "# driver: NvidiaGpuDriverLinux extension, driverVersion 535.161\n" in script, size
    assert "DRV_PKGS=" not in script and "waiting for the GRID driver" in script  # never cuda-drivers on GRID
    assert (
        re.search(r"^DRV_MIN=(\d+)$", script, re.MULTILINE)
        and int(re.search(r"^DRV_MIN=(\d+)$", script, re.MULTILINE)[1]) <= 535
    )


def test_p100_is_not_sold_and_says_so(tmp_path: Path) -> None:
    """P100 (Azure NCv2) has no active offering: a clear refusal, no script."""
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: audit\nresources:\n  cloud: azure\n  gpu: P100:1\nstack: {framework: pytorch}\n"
        "max_duration: 1h\nrun: python train.py\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "gpucloud", "render", str(job)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "GPUCLOUD_HOME": str(tmp_path / "home")},
        timeout=60,
        check=False,
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr and "P100" in out.stderr, out.stderr
