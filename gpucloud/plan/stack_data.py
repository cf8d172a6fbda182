"""The stack tables: GPU generation -> driver / CUDA / cuDNN / OS / framework limits, with sources.

Split from gpucloud/plan/stacks.py so that the data can be reviewed on its own: every number here is
restated in docs/STACKS.md with its source and the date it was checked. The code that walks these
tables is gpucloud/plan/stacks.py (one GPU) and gpucloud/plan/images.py (one VM: image, modules, fabric manager).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# --------------------------------------------------------------------------------------------------
# Tables (docs/STACKS.md unless marked [K] = widely known, not re-checked).
# --------------------------------------------------------------------------------------------------

# Lowest Linux driver per CUDA toolkit [S: CUDA release notes, via docs/STACKS.md]. Only these toolkit
# versions can be pinned, so that every pin is checked against a sourced minimum.
MIN_DRIVER: dict[str, str] = {
    "11.0": "450.51.05",
    "11.2": "460.27.03",
    # 11.4 GA needs 470.42.01, but the repository's cuda-toolkit-11-4 is 11.4 Update 4, and 11.4 U3+
    # needs >= 470.82.01 (docs/STACKS.md) -- the figure the installer must check.
    "11.4": "470.82.01",
    "11.6": "510.39.01",
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.2": "535.54.03",
    "12.4": "550.54.14",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
    "13.1": "590.44.01",
    # 13.2 ships with R595 (AWS DLAMI Base OSS, Oct 2026: driver 595.91.07 next to CUDA 13.2). The exact
    # minimum of the 13.2 release notes was not read: the branch is the floor ("595" = any 595.x) [I].
    "13.2": "595",
}
# Minor-version compatibility floor per CUDA major (docs/STACKS.md): an application built with any
# 12.x runtime (e.g. a cu128 PyTorch wheel) runs on driver >= 525.60.13, without PTX JIT of newer PTX.
COMPAT_FLOOR: dict[str, str] = {"11": "450.80.02", "12": "525.60.13", "13": "580"}
# Driver branches the NVIDIA repository ships as meta-packages; from 590 the `cuda-drivers`
# package has no branch suffix and a branch is locked by pinning its version (docs/STACKS.md).
DRIVER_BRANCHES = (450, 460, 470, 510, 520, 525, 535, 545, 550, 560, 565, 570, 575, 580, 590, 595)
UNSUFFIXED_FROM = 590
# NVIDIA's version-locking packages `nvidia-driver-pinning-<branch>` (installed before the driver,
# they hold every driver package of the branch: the meta-packages' own `Depends:` have no upper
# bound) are documented from branch 580 on (driver installation guide, "Version locking",
# "Recent updates"; docs/STACKS.md). Older branches are held by an apt preferences file the
# bootstrap writes itself (apt_preferences(5), the "normal distribution version locking").
PINNING_FROM = 580


@dataclass(frozen=True)
class Profile:
    """One row of docs/STACKS.md: what a GPU generation can run and what it gets by default."""

    name: str
    architectures: tuple[str, ...]
    driver: int  # default branch
    max_driver: int | None  # last branch that supports it (None: current branches all do)
    cuda: str  # default toolkit
    max_cuda: str  # newest toolkit that still compiles for it
    max_cuda_reason: str
    cudnn: str  # default cuDNN
    cudnn_ok: re.Pattern[str]  # cuDNN pins it can run
    cudnn_limit: str  # the rule, in words
    ubuntu: str
    torch_default: str | None  # None: no official wheels
    torch_max: str | None  # newest PyTorch minor with kernels for it
    torch_max_variant: str | None  # newest wheel variant (cuXYZ) with kernels for it
    tf_default: str
    tf_range: tuple[str, str]  # TensorFlow minor versions with kernels for it (inclusive)
    reasons: dict[str, str]


KEPLER = Profile(
    name="Kepler",
    architectures=("Kepler",),
    driver=470,
    max_driver=470,
    cuda="11.4",
    max_cuda="11.4",
    max_cuda_reason=(
        "Kepler (sm_35/sm_37) is limited to CUDA 11.x: its last driver branch, R470, runs CUDA 11.4 "
        "natively (11.4 U3+ with >= 470.82.01), and CUDA 12.0 removed sm_35/sm_37 entirely"
    ),
    cudnn="8.2.4",
    cudnn_ok=re.compile(r"^8\.[0-5](\.\d+)*$"),
    cudnn_limit="cuDNN 8.0-8.5 is safe on Kepler; cuDNN 8.9 and 9.x need compute capability >= 5.0",
    ubuntu="20.04",
    torch_default="2.1.2",
    torch_max="2.1",
    torch_max_variant="cu118",
    tf_default="2.11.1",
    tf_range=("2.4", "2.11"),
    reasons={
        "driver": "R470 is the last driver branch that supports Kepler (EOL July 2024, so no more security fixes).",
        "cuda": "CUDA 11.4 is the newest toolkit R470 runs natively; CUDA 12.0 removed sm_35/sm_37.",
        "cudnn": "cuDNN 8.2.4 built for CUDA 11.4 (libcudnn8 8.2.4 +cuda11.4); 8.9 and 9.x need compute capability >= "
        "5.0.",
        "os_image": "NVIDIA's CUDA 11.4 repositories exist only for Ubuntu 18.04/20.04 (CUDA 13 dropped 20.04), so "
        "Kepler stays on 20.04.",
        "pytorch": (
            "PyTorch 2.1.2+cu118: the cu118 wheels 2.1-2.7.1 carry sm_37 kernels, but from 2.2 their bundled cuDNN "
            "no longer supports Kepler, so 2.1.2 is the last fully working one. The wheel's CUDA 11.8 runtime runs on "
            "R470 through CUDA minor-version compatibility (any 11.x app on driver >= 450.80.02)."
        ),
        "pytorch_max": (
            "the cu118 wheels 2.1-2.7.1 carry sm_37 kernels, but from 2.2 their bundled cuDNN no longer supports "
            "Kepler, so <= 2.1.2 is the last fully working one"
        ),
        "tensorflow": "TensorFlow 2.11 is the newest release with Kepler kernels (built for CUDA 11.2 / cuDNN 8.1; "
        "runs on the 11.4 toolkit by minor-version compatibility).",
    },
)
MAXWELL_VOLTA = Profile(
    name="Maxwell-Volta",
    architectures=("Maxwell", "Pascal", "Volta"),
    driver=580,
    max_driver=580,
    cuda="12.9",
    max_cuda="12.9",
    max_cuda_reason=(
        "Maxwell, Pascal and Volta (sm_50-sm_70) are limited to CUDA 12.x: CUDA 12.9 is the last toolkit "
        "that compiles for them (CUDA 13.0 removed them), and R580 is their last driver branch"
    ),
    cudnn="9.10",
    cudnn_ok=re.compile(r"^(8\.9(\.\d+)*|9\.([0-9]|10)(\.\d+)*)$"),
    cudnn_limit='cuDNN 8.9 or 9.0-9.10 (cuDNN 9.11 dropped sm_50-sm_70; an unpinned "9" would install it)',
    ubuntu="22.04",
    torch_default="2.7.1",
    torch_max=None,
    torch_max_variant="cu126",
    tf_default="2.19.0",
    tf_range=("2.14", "2.20"),
    reasons={
        "driver": "R580 is the last driver branch for Maxwell/Pascal/Volta (long-term support branch; end of life "
        "June 2028).",
        "cuda": "CUDA 12.9 is the last toolkit that compiles for sm_50-sm_70; CUDA 13.0 removed them.",
        "cudnn": (
            "cuDNN 9.10 for CUDA 12, pinned (cudnn9-cuda-12=9.10.*): cuDNN 9.11 dropped sm_50-sm_70 kernels, so "
            "the unpinned package would install a cuDNN without kernels for this GPU."
        ),
        "os_image": "Ubuntu 22.04 has NVIDIA repositories for CUDA 12.x and R580 and is supported by both clouds' GPU "
        "images.",
        "pytorch": (
            "PyTorch's cu126 wheels are the newest variant that still carries sm_50-sm_70 kernels (newer cu128+ builds "
            "dropped them); 2.7.1 is a stable release with cu126 wheels. The wheel's CUDA 12.6 runtime runs on R580."
        ),
        "tensorflow": "TensorFlow 2.19 (tested with CUDA 12.5 / cuDNN 9.3); tensorflow[and-cuda] brings those "
        "libraries as pip wheels.",
    },
)
TURING_PLUS = Profile(
    name="Turing+",
    architectures=("Turing", "Ampere", "Ada", "Hopper", "Blackwell"),
    driver=580,
    max_driver=None,
    cuda="12.8",
    max_cuda="13.2",
    max_cuda_reason="the newest CUDA toolkit gpucloud knows the minimum driver for is 13.2",
    cudnn="9",
    cudnn_ok=re.compile(r"^(8\.9|9)(\.\d+)*$"),
    cudnn_limit="cuDNN 8.9 or 9.x",
    ubuntu="22.04",
    torch_default="2.8.0",
    torch_max=None,
    torch_max_variant=None,
    tf_default="2.19.0",
    tf_range=("2.14", "2.20"),
    reasons={
        "driver": (
            "R580 is a current long-term support branch and runs every CUDA up to 13.0 (end of life June 2028); newer "
            "branches (590, 595) are only needed for CUDA 13.1+ and are chosen automatically when such a CUDA is "
            "pinned."
        ),
        "cuda": "CUDA 12.8 matches the default PyTorch wheels (cu128) and supports every GPU from Turing to "
        "Blackwell; pin 13.x to opt in.",
        "cudnn": "cuDNN 9 for CUDA 12 (cudnn9-cuda-12 from NVIDIA's CUDA repository).",
        "os_image": (
            "Ubuntu 22.04 rather than 24.04: NVIDIA ships CUDA 12.x/13.x and R580 for both, but 22.04 is the release "
            "both clouds' GPU driver tooling (Azure's NvidiaGpuDriverLinux extension, AWS images) have covered "
            "longest, "
            "and it keeps one image line for every non-Kepler GPU."
        ),
        "pytorch": "PyTorch 2.8.0 with cu128 wheels: current release, kernels for sm_75 through sm_120.",
        "tensorflow": "TensorFlow 2.19 (tested with CUDA 12.5 / cuDNN 9.3); tensorflow[and-cuda] brings those "
        "libraries as pip wheels.",
    },
)
PROFILES = (KEPLER, MAXWELL_VOLTA, TURING_PLUS)

# Oldest CUDA toolkit that knows the architecture [K: CUDA release notes]; only table versions count.
MIN_CUDA: dict[str, str] = {"Ampere": "11.2", "Ada": "11.8", "Hopper": "11.8", "Blackwell": "12.8"}
# Architectures the proprietary kernel modules do not drive: they need the open modules
# (`nvidia-open-<branch>`), and R570+ [V: NVIDIA open-modules announcement; docs/STACKS.md].
OPEN_MODULES_ONLY: dict[str, int] = {"Blackwell": 570}
# Architectures the open modules cannot drive (pre-Turing): proprietary `cuda-drivers-<branch>` only.
PROPRIETARY_ONLY: frozenset[str] = frozenset({"Kepler", "Maxwell", "Pascal", "Volta"})
# TensorFlow builds without kernels for an architecture (the default 2.19 lists sm_60, sm_70, sm_80,
# sm_89, compute_90 in its .bazelrc, checked Dec 2026 [V]); gpucloud knows no 2.14-2.20 release
# that has them, so TensorFlow is refused there.
TF_NO_KERNELS: dict[str, str] = {
    "Maxwell": (
        "TensorFlow 2.19 (the default) is built for sm_60, sm_70, sm_80, sm_89 and compute_90 only: no Maxwell "
        "(sm_50/sm_52) kernels, and gpucloud knows no release in 2.14-2.20 that has them"
    ),
}

# The first CUDA major whose toolkit has no code for the architecture: CUDA 12.0 removed sm_35/sm_37
# (Kepler), CUDA 13.0 removed sm_50-sm_70 (Maxwell, Pascal, Volta) (docs/STACKS.md). An image built
# with that CUDA (or newer) cannot run there, whatever the driver.
CUDA_DROPPED: dict[str, int] = {"Kepler": 12, "Maxwell": 13, "Pascal": 13, "Volta": 13}
# A container job's host on a plain Ubuntu image: Ubuntu's docker.io, and NVIDIA's container toolkit
# from NVIDIA's libnvidia-container apt repository, all four packages at one pinned version as NVIDIA's
# install guide lists them; 1.20.1 is what the AWS Deep Learning Base OSS AMIs ship in October 2026
# (docs/STACKS.md, "Containers").
CONTAINER_TOOLKIT_VERSION = "1.20.1-1"
CONTAINER_TOOLKIT_PACKAGES: tuple[str, ...] = tuple(
    f"{name}={CONTAINER_TOOLKIT_VERSION}"
    for name in (
        "nvidia-container-toolkit",
        "nvidia-container-toolkit-base",
        "libnvidia-container-tools",
        "libnvidia-container1",
    )
)
CONTAINER_TOOLKIT_REPO = "https://nvidia.github.io/libnvidia-container"
CONTAINER_ENGINE_PACKAGES: tuple[str, ...] = ("docker.io",)

# Per-GPU notes that the architecture alone does not tell.
GPU_WARNINGS: dict[str, str] = {
    "A10": (
        "The A10 is offered on Azure NVadsA10 v5, which needs NVIDIA's GRID (vGPU guest) driver, not the datacenter "
        "`cuda-drivers` packages: install it with Azure's NvidiaGpuDriverLinux extension or Microsoft's GRID build "
        "(docs/STACKS.md); the CUDA/cuDNN/framework choices below still apply."
    ),
    "K80": "R470 reached end of life in July 2024: the driver gets no more security fixes.",
    "K40": "R470 reached end of life in July 2024: the driver gets no more security fixes.",
}

# PyTorch: minor version -> (full version used for that minor, wheel variants on download.pytorch.org) [K].
TORCH_WHEELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "1.12": ("1.12.1", ("cu113", "cu116")),
    "1.13": ("1.13.1", ("cu116", "cu117")),
    "2.0": ("2.0.1", ("cu117", "cu118")),
    "2.1": ("2.1.2", ("cu118", "cu121")),
    "2.2": ("2.2.2", ("cu118", "cu121")),
    "2.3": ("2.3.1", ("cu118", "cu121")),
    "2.4": ("2.4.1", ("cu118", "cu121", "cu124")),
    "2.5": ("2.5.1", ("cu118", "cu121", "cu124")),
    "2.6": ("2.6.0", ("cu118", "cu124", "cu126")),
    "2.7": ("2.7.1", ("cu118", "cu126", "cu128")),
    "2.8": ("2.8.0", ("cu126", "cu128", "cu129")),
    "2.9": ("2.9.0", ("cu126", "cu128", "cu130")),
}
TORCH_INDEX = "https://download.pytorch.org/whl/"
# cuDNN 8 releases whose CUDA build label is known (docs/STACKS.md: `libcudnn8=8.2.4.*-1+cuda11.4`); a build
# for CUDA 11.4 serves every 11.x toolkit. Other 8.x pins match any build of that release.
CUDNN8_BUILDS: dict[str, str] = {"8.2.4": "11.4"}
# GPUs with no official PyTorch wheels at all (docs/STACKS.md: K40, none after about 1.2).
NO_PYTORCH: frozenset[str] = frozenset({"K40"})
CPU_TORCH = "2.8.0"
CPU_TENSORFLOW = "2.19.0"


@dataclass(frozen=True)
class Stack:
    """The software one job's machines get (driver, CUDA, cuDNN, OS, framework), resolved by
    gpucloud/plan/stacks.py; plain data, so the provider contract can carry it."""

    gpu: str  # canonical GPU name, e.g. "K80"
    architecture: str  # "Kepler"
    compute_capability: str  # "3.7"
    driver: str  # branch, e.g. "470"
    cuda: str  # "11.4"
    cudnn: str  # "8.2.4"
    os_image: str  # "ubuntu-20.04"
    framework: str  # "pytorch" | "tensorflow" | "none"
    framework_version: str | None  # "2.0.1" (None when framework is none)
    # What the VM-side installer needs (Ubuntu/apt names, exact pins):
    ubuntu_version: str  # "20.04"
    cuda_repo: str  # "ubuntu2004" (path part of NVIDIA's apt repository)
    driver_packages: tuple[str, ...]  # e.g. ("cuda-drivers-470",)
    cuda_packages: tuple[str, ...]  # e.g. ("cuda-toolkit-11-4",)
    cudnn_packages: tuple[str, ...]  # e.g. ("libcudnn8=8.2.4.*-1+cuda11.4",)
    framework_pip: tuple[
        str, ...
    ]  # pip args, e.g. ("torch==2.0.1", "--index-url", "https://download.pytorch.org/whl/cu117")
    min_driver_version: str  # lowest driver that runs this CUDA, e.g. "470.82.01"
    reasons: dict[str, str] = field(default_factory=dict)  # per key above: why it was chosen
    warnings: tuple[str, ...] = ()
    # "open" (nvidia-open-*: required by Blackwell) or "proprietary" (cuda-drivers-*: all older GPUs).
    kernel_modules: str = "proprietary"
    # True: the system CUDA toolkit and cuDNN are installed (the job asked, or its framework needs
    # them); False: the framework wheel brings its own CUDA runtime and cuDNN, the VM needs only the driver.
    cuda_toolkit: bool = False
    driver_pinned: bool = False  # the job pinned the driver: an image's other branch does not do
    # NVIDIA's version-locking package of the branch, installed before the driver (empty before R580:
    # the bootstrap's own apt preferences file holds those branches).
    driver_lock: tuple[str, ...] = ()
    # A `container:` job: the image (its reference), the CUDA it was built for ("unknown" when no
    # source said), and what the host adds to the driver: an engine and NVIDIA's container toolkit.
    container_image: str = ""
    container_cuda: str = ""
    engine_packages: tuple[str, ...] = ()
    toolkit_packages: tuple[str, ...] = ()

    def as_json(self) -> dict[str, object]:
        """The `stack` object of `plan --json` / `stack --json` (DESIGN.md section 4)."""
        return {
            "gpu": self.gpu,
            "architecture": self.architecture,
            "driver": self.driver,
            "cuda": self.cuda,
            "cudnn": self.cudnn,
            "os_image": self.os_image,
            "framework": self.framework if self.framework == "none" else f"{self.framework}=={self.framework_version}",
        }
