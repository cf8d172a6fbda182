"""A stub VM for the agent's stack stages: the real stage code, run in-process with the stub
nvidia-smi/dpkg/apt-get/modprobe/systemctl/python3 of tests/support/vm_stubs first on PATH, the fake
apt resolving against tests/data/nvidia_repo_packages.txt, and a fake clock for every wait."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpucloud.contract.registry import capabilities
from gpucloud.plan.images import cpu_arch_of, resolve_node
from gpucloud.plan.planner import Candidate
from gpucloud.plan.stacks import Stack
from gpucloud.vm.agent.stage_api import StageEnv
from gpucloud.vm.stack_config import stack_config

STUBS = Path(__file__).resolve().parent.parent / "support" / "vm_stubs"
NVIDIA_REPO_INDEX = Path(__file__).resolve().parent.parent / "data" / "nvidia_repo_packages.txt"
KERNEL = os.uname().release
APT = "apt-get -o DPkg::Lock::Timeout=600 -o Acquire::Retries=3 install -y --no-install-recommends "
APT_UPDATE = "apt-get -o DPkg::Lock::Timeout=600 -o Acquire::Retries=3 update"
HEADERS = APT + f"linux-headers-{KERNEL}"
LOCK_580 = HEADERS + " nvidia-driver-pinning-580"


@dataclass
class FakeClock:
    """now/sleep for the stages; `on_sleep` runs at each sleep (the world moving on meanwhile)."""

    t: float = 1_000_000.0
    step: float | None = None  # advance this much per sleep instead of the time asked for
    sleeps: list[float] = field(default_factory=list)
    on_sleep: Any = None
    stop_after: int | None = None  # stopping() turns True after this many sleeps

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds if self.step is None else self.step
        if self.on_sleep is not None:
            self.on_sleep(len(self.sleeps))

    def stopping(self) -> bool:
        return self.stop_after is not None and len(self.sleeps) >= self.stop_after


def installed_only(pkg: str, flag: str) -> str:
    """The start of a stub command that answers only once `pkg` is installed (or `flag` is set in its
    environment: present in the image from the start), recording its calls; a body follows."""
    check = f"[[ -f $STUB_STATE/pkgs/{pkg} || -n ${{{flag}:-}} ]] || exit 127"
    return f'source "{STUBS}/_common.sh"\nrecord "$@"\n{check}\n'


@dataclass
class StubVm:
    """One simulated machine: its stub state (installed packages, calls), work folder and /etc."""

    tmp: Path
    clock: FakeClock = field(default_factory=FakeClock)
    stub_env: dict[str, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.state = self.tmp / "stub-state"
        self.vm_dir = self.tmp / "vm"
        self.etc = self.tmp / "etc"
        self.cuda_root = self.tmp / "cuda-root"
        for folder in (self.state / "pkgs", self.state / "py", self.vm_dir):
            folder.mkdir(parents=True, exist_ok=True)

    def preinstall(self, **packages: str) -> StubVm:
        """Packages the image already has (name=version; '-' in names written as '_')."""
        for name, version in packages.items():
            (self.state / "pkgs" / name.replace("_", "-")).write_text(version)
        return self

    def override(self, name: str, body: str) -> StubVm:
        """A command that behaves differently on this VM, first on PATH (ahead of the stubs)."""
        folder = self.tmp / "override"
        folder.mkdir(exist_ok=True)
        (folder / name).write_text("#!/bin/bash\n" + body)
        (folder / name).chmod(0o755)
        return self

    def env(self, cfg: dict[str, Any]) -> StageEnv:
        repo = self.tmp / "nvidia-repo" / str(cfg.get("cuda_repo", "")) / str(cfg.get("repo_arch", ""))
        repo.mkdir(parents=True, exist_ok=True)
        (repo / "cuda-keyring_1.1-1_all.deb").write_bytes(b"!<arch>\nfake keyring\n")
        environ = {
            "PATH": f"{self.tmp / 'override'}:{STUBS}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(self.tmp),
            "LANG": "C.UTF-8",
            "GPUCLOUD_NVIDIA_REPO": (self.tmp / "nvidia-repo").as_uri(),
            "GPUCLOUD_CUDA_ROOT": str(self.cuda_root),
            "GPUCLOUD_ETC": str(self.etc),
            "STUB_STATE": str(self.state),
            "STUB_APT_REPO": str(NVIDIA_REPO_INDEX),
            "STUB_REAL_PYTHON": sys.executable,
            **self.stub_env,
        }
        return StageEnv(
            log=self.lines.append,
            vm_dir=self.vm_dir,
            environ=environ,
            now=self.clock.now,
            sleep=self.clock.sleep,
            stopping=self.clock.stopping,
        )

    def log(self) -> str:
        return "".join(f"[gpucloud] {line}\n" for line in self.lines)

    def calls(self) -> list[str]:
        path = self.state / "calls"
        return path.read_text().splitlines() if path.exists() else []

    def apt_installs(self) -> list[str]:
        return [c for c in self.calls() if c.startswith("apt-get ") and " install " in f" {c} "]

    def pip_installs(self) -> list[str]:
        return [c for c in self.calls() if c.startswith("python3 -m pip install")]

    def installed(self, name: str) -> str | None:
        path = self.state / "pkgs" / name
        return path.read_text() if path.exists() else None

    def pins_file(self) -> Path:
        return self.etc / "apt" / "preferences.d" / "gpucloud-nvidia-driver"

    def stack_log(self) -> str:
        path = self.vm_dir / "stack.log"
        return path.read_text() if path.exists() else ""


def candidate(cloud: str, gpu: str, count: int, instance_type: str, arch: str = "x86_64") -> Candidate:
    return Candidate(
        arch=arch,
        cloud=cloud,
        region="us-east-1" if cloud != "local" else "local",
        instance_type=instance_type,
        gpu=gpu,
        gpu_count=count,
        num_nodes=1,
        spot=False,
        price_per_hour=0.9,
        total_per_hour=0.9,
        estimated_cost=0.9,
    )


def config(
    stack: Stack,
    cloud: str,
    gpu: str,
    count: int,
    instance_type: str,
    *,
    job_image: str = "auto",
    arch: str = "x86_64",
) -> dict[str, Any]:
    """The stages' config as the CLI builds it for this machine (real stack, image and capabilities)."""
    cand = candidate(cloud, gpu, count if gpu else 0, instance_type, arch)
    node = resolve_node(stack, cloud, instance_type, cand.gpu_count, cpu_arch=cpu_arch_of(cand), job_image=job_image)
    return stack_config(node, stack, cand, capabilities(cloud))


@pytest.fixture
def vm(tmp_path: Path) -> StubVm:
    return StubVm(tmp_path)
