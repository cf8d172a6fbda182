"""The stack stage's installs, resolved against what NVIDIA's repositories declare.

tests/data/nvidia_repo_packages.txt restates the real package names, versions and `Depends:` lines
(with sources); tests/support/fake_apt.py resolves the bootstrap's apt-get installs against it as
apt does (candidates by pin priority, version relations, DKMS needing the running kernel's headers).
An unbounded branch pin or a missing header package ends on the wrong driver or a failed install.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucloud.plan.images import resolve_node
from gpucloud.plan.stacks import resolve_stack
from gpucloud.spec.load import StackSpec
from tests.support.fake_apt import load_repo
from tests.support.vm_boot import NVIDIA_REPO_INDEX, make_vm
from tests.support.vm_sim import GPU_NAMES

FAKE_APT = Path(__file__).parent.parent / "support" / "fake_apt.py"
KERNEL = os.uname().release


def _apt(state: Path, etc: Path, *pkgs: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STUB_STATE": str(state), "STUB_APT_REPO": str(NVIDIA_REPO_INDEX), "GPUCLOUD_ETC": str(etc)}
    return subprocess.run(
        [sys.executable, str(FAKE_APT), "install", "-y", *pkgs], env=env, text=True, capture_output=True, check=False
    )


def _installed(state: Path, name: str) -> str | None:
    f = state / "pkgs" / name
    return f.read_text() if f.exists() else None


def test_repository_index_carries_its_sources() -> None:
    text = NVIDIA_REPO_INDEX.read_text()
    assert "Collected 2026-12-04" in text
    repo = load_repo(NVIDIA_REPO_INDEX)
    stanzas = [block for block in text.split("\n\n") if "Package: " in block]
    assert all("X-Source: " in block for block in stanzas)
    # NVIDIA's own line (forum thread 353805): no upper bound on the driver
    (cd580,) = repo["cuda-drivers-580"]
    assert "nvidia-driver (>= 580.65.06)" in cd580.depends and "<<" not in cd580.depends


def test_fake_apt_shows_why_a_meta_package_alone_does_not_hold_a_branch(tmp_path: Path) -> None:
    """Without a lock, cuda-drivers-580 brings the newest driver; `cuda-drivers=590.*` pins only itself."""
    state, etc = tmp_path / "s", tmp_path / "etc"
    assert _apt(state, etc, f"linux-headers-{KERNEL}").returncode == 0
    assert _apt(state, etc, "cuda-drivers-580").returncode == 0
    assert _installed(state, "nvidia-driver") == "595.71.05-1" and (state / "kmod").read_text() == "595.71.05"
    state2 = tmp_path / "s2"
    _apt(state2, etc, f"linux-headers-{KERNEL}")
    assert _apt(state2, etc, "cuda-drivers=590.*").returncode == 0
    assert _installed(state2, "cuda-drivers") == "590.44.01-1" and _installed(state2, "nvidia-driver") == "595.71.05-1"
    # NVIDIA's pinning package, installed first, holds every package of the branch
    state3 = tmp_path / "s3"
    _apt(state3, etc, f"linux-headers-{KERNEL}", "nvidia-driver-pinning-580")
    assert _apt(state3, etc, "cuda-drivers-580").returncode == 0
    assert (state3 / "kmod").read_text() == "580.105.08"


def test_fake_apt_fails_a_dkms_module_without_the_running_kernels_headers(tmp_path: Path) -> None:
    state, etc = tmp_path / "s", tmp_path / "etc"
    out = _apt(state, etc, "nvidia-driver-pinning-580", "cuda-drivers-580")
    assert out.returncode == 100 and f"kernel headers for kernel {KERNEL} cannot be found" in out.stderr
    assert not (state / "kmod").exists()
    # headers in the same transaction are not "before": dpkg may build the module first
    out = _apt(tmp_path / "s2", etc, f"linux-headers-{KERNEL}", "cuda-drivers-580")
    assert out.returncode == 100


# (GPU, pins, instance, expected branch, driver package): every branch the stack table can choose or
# a job can pin, installed on plain Ubuntu from the fake repository.
CASES = [
    ("K80", {}, "p2.xlarge", "470", "cuda-drivers-470"),
    ("V100", {}, "p3dn.24xlarge", "580", "cuda-drivers-580"),
    ("T4", {"driver": "535"}, "g4dn.xlarge", "535", "cuda-drivers-535"),
    ("T4", {"driver": "570"}, "g4dn.xlarge", "570", "cuda-drivers-570"),
    ("T4", {}, "g4dn.xlarge", "580", "cuda-drivers-580"),
    ("T4", {"cuda": "13.1"}, "g4dn.xlarge", "590", "cuda-drivers=590.*"),
    ("B200", {}, "p6-b200.48xlarge", "580", "nvidia-open-580"),
    ("B200", {"cuda": "13.1"}, "p6-b200.48xlarge", "590", "nvidia-open=590.*"),
]


@pytest.mark.parametrize(("gpu", "pins", "instance", "branch", "package"), CASES, ids=[f"{c[0]}-{c[3]}" for c in CASES])
def test_bootstrap_installs_end_on_the_stacks_branch(
    tmp_path: Path, gpu: str, pins: dict[str, str], instance: str, branch: str, package: str
) -> None:
    stack = resolve_stack(gpu, StackSpec(framework="none", **pins))
    assert stack.driver == branch and stack.driver_packages == (package,)
    node = resolve_node(stack, "aws", instance, 1, job_image="ami-0123456789abcdef0")  # plain image: apt installs
    vm = make_vm(
        tmp_path,
        provider="aws",
        stack=stack,
        gpu=gpu,
        render_kw={"node": node},
        stub_env={"STUB_GPU_NAME": GPU_NAMES[gpu]},
    ).run(timeout=60)
    assert vm.status()["state"] == "succeeded", (vm.status(), (vm.vm_dir / "stack.log").read_text())
    installs = [c.split("--no-install-recommends ", 1)[1] for c in vm.apt_installs()]
    lock = [f"nvidia-driver-pinning-{branch}"] if int(branch) >= 580 else []
    assert installs[0] == " ".join([f"linux-headers-{KERNEL}", *lock])  # before any DKMS package
    assert installs[1] == package
    modules = "nvidia-kernel-open-dkms" if package.startswith("nvidia-open") else "nvidia-kernel-dkms"
    built = {p.name for p in (vm.state / "pkgs").iterdir() if p.name.startswith("nvidia-kernel-")}
    assert built == {modules}, built  # Blackwell: the open modules only
    kmod = (vm.state / "kmod").read_text()
    assert kmod.split(".")[0] == branch, kmod
    prefs = (tmp_path / "etc" / "apt" / "preferences.d" / "gpucloud-nvidia-driver").read_text()
    assert f"Pin: version {branch}.*" in prefs and "Pin-Priority: 1001" in prefs
