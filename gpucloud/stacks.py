"""GPU architecture -> driver / CUDA / cuDNN / OS image / framework, with pin validation.

The data is the point of this module: the tables below restate FACTS.md section 3 (with its
sources) so that a reviewer can check each number against the source, and the code only walks
them. Each GPU generation gets the newest stack that still supports it; a pin the GPU cannot run
is a `UserError` that states the limit and what to do instead, because a wrong combination would
otherwise surface an hour later as a VM that silently trains on the CPU.

The Stack dataclass is a contract used by planner, render and the providers; keep its attributes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpucloud.errors import UserError

if TYPE_CHECKING:
    from gpucloud.spec import StackSpec

# --------------------------------------------------------------------------------------------------
# Tables (FACTS.md section 3 unless marked [K] = widely known, not re-checked).
# --------------------------------------------------------------------------------------------------

# Lowest Linux driver per CUDA toolkit [S: CUDA release notes, via FACTS.md s3]. Only these toolkit
# versions can be pinned, so that every pin is checked against a sourced minimum.
MIN_DRIVER: dict[str, str] = {
    "11.0": "450.51.05",
    "11.2": "460.27.03",
    # 11.4 GA needs 470.42.01, but the repository's cuda-toolkit-11-4 is 11.4 Update 4, and 11.4 U3+
    # needs >= 470.82.01 (FACTS.md s3) -- the figure the installer must check.
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
}
# Minor-version compatibility floor per CUDA major (FACTS.md s3): an application built with any
# 12.x runtime (e.g. a cu128 PyTorch wheel) runs on driver >= 525.60.13, without PTX JIT of newer PTX.
COMPAT_FLOOR: dict[str, str] = {"11": "450.80.02", "12": "525.60.13", "13": "580"}
# Driver branches the NVIDIA repository ships as meta-packages; from 590 the `cuda-drivers`
# package has no branch suffix and a branch is locked by pinning its version (FACTS.md s3).
DRIVER_BRANCHES = (450, 460, 470, 510, 520, 525, 535, 545, 550, 560, 565, 570, 575, 580, 590)
UNSUFFIXED_FROM = 590


@dataclass(frozen=True)
class Profile:
    """One row of FACTS.md s3: what a GPU generation can run and what it gets by default."""

    name: str
    architectures: tuple[str, ...]
    driver: int                   # default branch
    max_driver: int | None        # last branch that supports it (None: current branches all do)
    cuda: str                     # default toolkit
    max_cuda: str                 # newest toolkit that still compiles for it
    max_cuda_reason: str
    cudnn: str                    # default cuDNN
    cudnn_ok: re.Pattern[str]     # cuDNN pins it can run
    cudnn_limit: str              # the rule, in words
    ubuntu: str
    torch_default: str | None     # None: no official wheels
    torch_max: str | None         # newest PyTorch minor with kernels for it
    torch_max_variant: str | None  # newest wheel variant (cuXYZ) with kernels for it
    tf_default: str
    tf_range: tuple[str, str]     # TensorFlow minor versions with kernels for it (inclusive)
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
    torch_default="2.0.1",
    torch_max="2.0",
    torch_max_variant="cu117",
    tf_default="2.11.1",
    tf_range=("2.4", "2.11"),
    reasons={
        "driver": "R470 is the last driver branch that supports Kepler (EOL July 2024, so no more security fixes).",
        "cuda": "CUDA 11.4 is the newest toolkit R470 runs natively; CUDA 12.0 removed sm_35/sm_37.",
        "cudnn": "cuDNN 8.2.4 built for CUDA 11.4 (libcudnn8 8.2.4 +cuda11.4); 8.9 and 9.x need compute capability >= 5.0.",
        "os_image": "NVIDIA's CUDA 11.4 repositories exist only for Ubuntu 18.04/20.04 (CUDA 13 dropped 20.04), so Kepler stays on 20.04.",
        "pytorch": (
            "PyTorch 2.0.1 is the newest release whose cu117 wheels still carry sm_37 kernels; the CUDA 11.7 runtime "
            "inside the wheel runs on R470 through CUDA minor-version compatibility (any 11.x app on driver >= 450.80.02)."
        ),
        "tensorflow": "TensorFlow 2.11 is the newest release with Kepler kernels (built for CUDA 11.2 / cuDNN 8.1; runs on the 11.4 toolkit by minor-version compatibility).",
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
    cudnn="9",
    cudnn_ok=re.compile(r"^(8\.9|9)(\.\d+)*$"),
    cudnn_limit="cuDNN 8.9 or 9.x",
    ubuntu="22.04",
    torch_default="2.7.1",
    torch_max=None,
    torch_max_variant="cu126",
    tf_default="2.19.0",
    tf_range=("2.14", "2.20"),
    reasons={
        "driver": "R580 is the last driver branch for Maxwell/Pascal/Volta (long-term support branch, to about Aug 2028).",
        "cuda": "CUDA 12.9 is the last toolkit that compiles for sm_50-sm_70; CUDA 13.0 removed them.",
        "cudnn": "cuDNN 9 for CUDA 12 (cudnn9-cuda-12 from NVIDIA's CUDA repository).",
        "os_image": "Ubuntu 22.04 has NVIDIA repositories for CUDA 12.x and R580 and is supported by both clouds' GPU images.",
        "pytorch": (
            "PyTorch's cu126 wheels are the newest variant that still carries sm_50-sm_70 kernels (newer cu128+ builds "
            "dropped them); 2.7.1 is a stable release with cu126 wheels. The wheel's CUDA 12.6 runtime runs on R580."
        ),
        "tensorflow": "TensorFlow 2.19 (tested with CUDA 12.5 / cuDNN 9.3); tensorflow[and-cuda] brings those libraries as pip wheels.",
    },
)
TURING_PLUS = Profile(
    name="Turing+",
    architectures=("Turing", "Ampere", "Ada", "Hopper", "Blackwell"),
    driver=580,
    max_driver=None,
    cuda="12.8",
    max_cuda="13.1",
    max_cuda_reason="the newest CUDA toolkit gpucloud knows the minimum driver for is 13.1",
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
            "R580 is a current long-term support branch and runs every CUDA up to 13.0; newer branches (590, 595) "
            "are only needed for CUDA 13.1+ and are chosen automatically when such a CUDA is pinned."
        ),
        "cuda": "CUDA 12.8 matches the default PyTorch wheels (cu128) and supports every GPU from Turing to Blackwell; pin 13.x to opt in.",
        "cudnn": "cuDNN 9 for CUDA 12 (cudnn9-cuda-12 from NVIDIA's CUDA repository).",
        "os_image": (
            "Ubuntu 22.04 rather than 24.04: NVIDIA ships CUDA 12.x/13.x and R580 for both, but 22.04 is the release "
            "both clouds' GPU driver tooling (Azure's NvidiaGpuDriverLinux extension, AWS images) have covered longest, "
            "and it keeps one image line for every non-Kepler GPU."
        ),
        "pytorch": "PyTorch 2.8.0 with cu128 wheels: current release, kernels for sm_75 through sm_120.",
        "tensorflow": "TensorFlow 2.19 (tested with CUDA 12.5 / cuDNN 9.3); tensorflow[and-cuda] brings those libraries as pip wheels.",
    },
)
PROFILES = (KEPLER, MAXWELL_VOLTA, TURING_PLUS)

# Oldest CUDA toolkit that knows the architecture [K: CUDA release notes]; only table versions count.
MIN_CUDA: dict[str, str] = {"Ampere": "11.2", "Ada": "11.8", "Hopper": "11.8", "Blackwell": "12.8"}

# Per-GPU notes that the architecture alone does not tell.
GPU_WARNINGS: dict[str, str] = {
    "A10": (
        "The A10 is offered on Azure NVadsA10 v5, which needs NVIDIA's GRID (vGPU guest) driver, not the datacenter "
        "`cuda-drivers` packages: install it with Azure's NvidiaGpuDriverLinux extension or Microsoft's GRID build "
        "(FACTS.md s3); the CUDA/cuDNN/framework choices below still apply."
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
# cuDNN 8 releases whose CUDA build label is known (FACTS.md s3: `libcudnn8=8.2.4.*-1+cuda11.4`); a build
# for CUDA 11.4 serves every 11.x toolkit. Other 8.x pins match any build of that release.
CUDNN8_BUILDS: dict[str, str] = {"8.2.4": "11.4"}
# GPUs with no official PyTorch wheels at all (FACTS.md s3: K40, none after about 1.2).
NO_PYTORCH: frozenset[str] = frozenset({"K40"})
CPU_TORCH = "2.8.0"
CPU_TENSORFLOW = "2.19.0"


# --------------------------------------------------------------------------------------------------
# The Stack (contract) and the resolver.
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stack:
    gpu: str                      # canonical GPU name, e.g. "K80"
    architecture: str             # "Kepler"
    compute_capability: str       # "3.7"
    driver: str                   # branch, e.g. "470"
    cuda: str                     # "11.4"
    cudnn: str                    # "8.2.4"
    os_image: str                 # "ubuntu-20.04"
    framework: str                # "pytorch" | "tensorflow" | "none"
    framework_version: str | None  # "2.0.1" (None when framework is none)
    # What the VM-side installer needs (Ubuntu/apt names, exact pins):
    ubuntu_version: str           # "20.04"
    cuda_repo: str                # "ubuntu2004" (path part of NVIDIA's apt repository)
    driver_packages: tuple[str, ...]   # e.g. ("cuda-drivers-470",)
    cuda_packages: tuple[str, ...]     # e.g. ("cuda-toolkit-11-4",)
    cudnn_packages: tuple[str, ...]    # e.g. ("libcudnn8=8.2.4.*-1+cuda11.4",)
    framework_pip: tuple[str, ...]     # pip args, e.g. ("torch==2.0.1", "--index-url", "https://download.pytorch.org/whl/cu117")
    min_driver_version: str       # lowest driver that runs this CUDA, e.g. "470.82.01"
    reasons: dict[str, str] = field(default_factory=dict)  # per key above: why it was chosen
    warnings: tuple[str, ...] = ()

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


def _v(version: str) -> tuple[int, ...]:
    """"470.82.01" -> (470, 82, 1), for ordering versions numerically."""
    return tuple(int(p) for p in re.findall(r"\d+", version))


def _pin(value: str | None) -> str | None:
    """None for "auto"/empty, else the stripped pin."""
    if value is None:
        return None
    value = str(value).strip()
    return None if value.lower() in ("", "auto") else value


def _profile(architecture: str) -> Profile:
    for p in PROFILES:
        if architecture in p.architectures:
            return p
    raise UserError(f"No software stack is defined for the {architecture} architecture.")  # pragma: no cover


def _driver_packages(branch: int) -> tuple[str, ...]:
    if branch >= UNSUFFIXED_FROM:
        return (f"cuda-drivers={branch}.*",)  # no suffix from 590: lock the branch by version
    return (f"cuda-drivers-{branch}",)


def _variant_cuda(variant: str) -> str:
    """"cu117" -> "11.7", "cu130" -> "13.0"."""
    digits = variant[2:]
    return f"{digits[:2]}.{digits[2:]}"


def _check_cuda_pin(cuda: str, gpu: str, arch: str, prof: Profile) -> None:
    if cuda not in MIN_DRIVER:
        raise UserError(
            f"stack.cuda: {cuda!r} is not a CUDA version gpucloud can check. Pin one of "
            f"{', '.join(MIN_DRIVER)} (the toolkits whose minimum driver is known), or leave it \"auto\"."
        )
    if prof.max_driver is not None and _v(MIN_DRIVER[cuda])[0] > prof.max_driver and _v(cuda)[0] == _v(prof.max_cuda)[0]:
        raise UserError(
            f"stack.cuda: {gpu} cannot use the CUDA {cuda} toolkit: it needs driver >= {MIN_DRIVER[cuda]}, but "
            f"R{prof.max_driver} is the last driver branch for {' / '.join(prof.architectures)} GPUs, and R{prof.max_driver} "
            f"runs CUDA {prof.max_cuda} natively. Pin {prof.max_cuda} or older, or leave it \"auto\"."
            + (" Framework wheels built for CUDA 11.5-11.7 (e.g. PyTorch cu117) still run on R470 by minor-version "
               "compatibility; only the system toolkit is limited." if prof is KEPLER else "")
        )
    if _v(cuda) > _v(prof.max_cuda):
        hint = " Leave cuda \"auto\" (11.4) or pin 11.4 or older; framework wheels built for CUDA 11.5-11.7 (e.g. PyTorch cu117) still run on R470." if prof is KEPLER else f" Pin {prof.max_cuda} or older, or leave it \"auto\" ({prof.cuda})."
        raise UserError(f"stack.cuda: {gpu} cannot use CUDA {cuda}: {prof.max_cuda_reason}.{hint}")
    floor = MIN_CUDA.get(arch)
    if floor and _v(cuda) < _v(floor):
        raise UserError(
            f"stack.cuda: {gpu} ({arch}) needs CUDA {floor} or newer; CUDA {cuda} has no code for it. "
            f"Leave cuda \"auto\" ({prof.cuda})."
        )


def _choose_driver(pin: str | None, cuda: str, cuda_pinned: bool, gpu: str, prof: Profile) -> tuple[int, str, str]:
    """(branch, min driver, reason). Raises when a pinned driver cannot run the GPU or the CUDA."""
    need = MIN_DRIVER[cuda]
    if pin is None:
        branch = max(prof.driver, next(b for b in DRIVER_BRANCHES if b >= _v(need)[0]))
        reason = prof.reasons["driver"]
        if branch != prof.driver:
            reason = f"R{branch}: the oldest branch that runs the pinned CUDA {cuda} (needs >= {need})."
        return branch, need, reason
    if not re.fullmatch(r"\d{3}(\.\d+){0,2}", pin):
        raise UserError(f"stack.driver: {pin!r} is not a driver branch or version. Use a branch such as \"580\" or a version such as \"580.65.06\".")
    branch = _v(pin)[0]
    if prof.max_driver is not None and branch > prof.max_driver:
        raise UserError(
            f"stack.driver: {gpu} cannot use driver {pin}: R{prof.max_driver} is the last driver branch that supports "
            f"{' / '.join(prof.architectures)} GPUs. Pin \"{prof.max_driver}\" or leave it \"auto\"."
        )
    # A branch pin ("535") means the newest driver of that branch; a full version is compared as given.
    runs = branch >= _v(need)[0] if "." not in pin else _v(pin) >= _v(need)
    if not runs:
        raise UserError(
            f"stack.driver: driver {pin} is too old for CUDA {cuda}, which needs driver >= {need} "
            f"(CUDA release notes). Pin a newer driver, or {'an older CUDA' if cuda_pinned else 'pin an older cuda'} "
            f"whose minimum it meets: "
            + ", ".join(c for c, d in MIN_DRIVER.items() if (_v(d)[0] <= branch if '.' not in pin else _v(d) <= _v(pin))) + "."
        )
    min_version = pin if "." in pin else need
    return branch, min_version, f"R{branch} as pinned; it runs CUDA {cuda} (needs >= {need})."


def _choose_cuda(pin: str | None, driver_pin: str | None, gpu: str, arch: str, prof: Profile) -> tuple[str, str]:
    if pin is not None:
        _check_cuda_pin(pin, gpu, arch, prof)
        return pin, f"CUDA {pin} as pinned; {gpu} supports up to {prof.max_cuda}."
    if driver_pin is not None and re.fullmatch(r"\d{3}(\.\d+){0,2}", driver_pin):
        # Honour the driver pin: the default CUDA, or the newest one that driver runs.
        branch = _v(driver_pin)[0]
        fits = [c for c, d in MIN_DRIVER.items()
                if _v(c) <= _v(prof.cuda) and (_v(d)[0] <= branch if "." not in driver_pin else _v(d) <= _v(driver_pin))]
        floor = MIN_CUDA.get(arch)
        fits = [c for c in fits if not floor or _v(c) >= _v(floor)]
        if fits and fits[-1] != prof.cuda:
            return fits[-1], f"CUDA {fits[-1]}: the newest toolkit the pinned driver {driver_pin} runs (default would be {prof.cuda})."
    return prof.cuda, prof.reasons["cuda"]


def _cudnn_packages(cudnn: str, cuda: str) -> tuple[str, ...]:
    """apt arguments for cuDNN; cuDNN 8 versions carry their CUDA build, e.g. 8.2.4.15-1+cuda11.4."""
    if cudnn.startswith("8."):
        build = CUDNN8_BUILDS.get(cudnn)
        return (f"libcudnn8={cudnn}.*-1+cuda{build}",) if build else (f"libcudnn8={cudnn}.*",)
    package = f"cudnn9-cuda-{cuda.split('.')[0]}"
    return (package,) if cudnn == "9" else (f"{package}={cudnn}.*",)


def _choose_cudnn(pin: str | None, cuda: str, gpu: str, prof: Profile) -> tuple[str, str]:
    if pin is None:
        return prof.cudnn, prof.reasons["cudnn"]
    if not prof.cudnn_ok.match(pin):
        raise UserError(
            f"stack.cudnn: {gpu} cannot use cuDNN {pin}: {prof.cudnn_limit}. "
            f"Pin a version in that range or leave it \"auto\" ({prof.cudnn})."
        )
    if pin.startswith("8.") and cuda.startswith("13"):
        raise UserError(f"stack.cudnn: cuDNN {pin} has no build for CUDA {cuda}; use cuDNN 9 with CUDA 13.")
    return pin, f"cuDNN {pin} as pinned ({prof.cudnn_limit})."


def _minor(version: str) -> str:
    parts = version.split(".")
    return ".".join(parts[:2])


def _choose_torch(pin: str | None, gpu: str, prof: Profile, cuda: str) -> tuple[str, tuple[str, ...], str]:
    """(version, pip args, reason) for PyTorch on this GPU; the wheel's CUDA must share the stack's major."""
    if prof.torch_default is None:  # pragma: no cover - K40 is caught before
        raise UserError(f"{gpu} has no official PyTorch wheels.")
    cuda_major = cuda.split(".")[0]

    def variant_for(minor: str) -> str | None:
        variants = [v for v in TORCH_WHEELS[minor][1]
                    if _variant_cuda(v).split(".")[0] == cuda_major
                    and (prof.torch_max_variant is None or _v(v[2:]) <= _v(prof.torch_max_variant[2:]))]
        if not variants:
            return None
        exact = [v for v in variants if _variant_cuda(v) == cuda]
        older = [v for v in variants if _v(_variant_cuda(v)) <= _v(cuda)]
        # Prefer the stack's own CUDA, then the newest older one, then the closest newer one
        # (which runs by minor-version compatibility).
        return (exact or older or variants[:1])[-1]

    if pin is None:
        order = [_minor(prof.torch_default)] + [m for m in reversed(TORCH_WHEELS) if m != _minor(prof.torch_default)]
        for minor in order:
            if prof.torch_max and _v(minor) > _v(prof.torch_max):
                continue
            variant = variant_for(minor)
            if variant:
                version = TORCH_WHEELS[minor][0]
                reason = prof.reasons["pytorch"] if minor == _minor(prof.torch_default) else (
                    f"PyTorch {version}+{variant}: the newest release with wheels for CUDA {cuda_major}.x that {gpu} can run.")
                return version, (f"torch=={version}", "--index-url", TORCH_INDEX + variant), reason
        raise UserError(f"stack.framework: no official PyTorch wheel supports {gpu} with CUDA {cuda}. Leave cuda \"auto\".")
    minor = _minor(pin)
    if minor not in TORCH_WHEELS:
        raise UserError(
            f"stack.framework_version: PyTorch {pin} is not one gpucloud knows wheels for. "
            f"Known: {', '.join(TORCH_WHEELS)} (or leave it \"auto\")."
        )
    if prof.torch_max and _v(minor) > _v(prof.torch_max):
        raise UserError(
            f"stack.framework_version: PyTorch {pin} has no kernels for {gpu}: PyTorch {prof.torch_max} "
            f"({TORCH_WHEELS[prof.torch_max][0]}+{prof.torch_max_variant}) is the newest release whose wheels support it. "
            f"Pin {TORCH_WHEELS[prof.torch_max][0]} or older, or leave it \"auto\"."
        )
    variant = variant_for(minor)
    if variant is None:
        raise UserError(
            f"stack.framework_version: PyTorch {pin} has no wheel for CUDA {cuda_major}.x that {gpu} can run "
            f"(its wheels: {', '.join(TORCH_WHEELS[minor][1])}). Pin another PyTorch or another cuda."
        )
    version = pin if pin.count(".") >= 2 else TORCH_WHEELS[minor][0]
    reason = f"PyTorch {version} as pinned, {variant} wheel (same CUDA major as the stack; runs by minor-version compatibility)."
    return version, (f"torch=={version}", "--index-url", TORCH_INDEX + variant), reason


def _choose_tensorflow(pin: str | None, gpu: str, prof: Profile, driver_branch: int) -> tuple[str, tuple[str, ...], str]:
    version = pin or prof.tf_default
    minor = _minor(version)
    low, high = prof.tf_range
    if not (_v(low) <= _v(minor) <= _v(high)):
        raise UserError(
            f"stack.framework_version: TensorFlow {version} does not fit {gpu}: gpucloud supports TensorFlow {low}-{high} "
            f"on {prof.name} GPUs" + (" (2.11 is the last release with Kepler kernels)" if prof is KEPLER else
                                       " (the releases with the [and-cuda] pip extra)") + ". Leave it \"auto\"."
        )
    if pin and pin.count(".") < 2:
        version = f"{pin}.0"
    if prof is KEPLER:
        return version, (f"tensorflow=={version}",), prof.reasons["tensorflow"] if not pin else f"TensorFlow {version} as pinned (uses the system CUDA 11 / cuDNN 8)."
    if driver_branch < _v(COMPAT_FLOOR["12"])[0]:
        raise UserError(f"stack.driver: TensorFlow's CUDA 12 wheels need driver >= {COMPAT_FLOOR['12']}; R{driver_branch} is too old.")
    reason = prof.reasons["tensorflow"] if not pin else f"TensorFlow {version} as pinned, with its CUDA libraries from the [and-cuda] extra."
    return version, (f"tensorflow[and-cuda]=={version}",), reason


def _k40_pytorch_error(gpu: str) -> UserError:
    return UserError(
        f"stack.framework: PyTorch has had no official wheels for the Tesla {gpu} (Kepler, sm_35) since about release 1.2, "
        "so gpucloud cannot install one. What you can do: (1) keep framework: none and build PyTorch from source in "
        "`setup:` with TORCH_CUDA_ARCH_LIST=3.5 against the stack's CUDA 11.4 (slow, but it works); (2) use framework: none "
        "and install your own build or wheel; (3) use framework: tensorflow (2.4-2.11 still ship sm_35 kernels); or "
        "(4) pick a K80 (PyTorch 2.0.1+cu117 runs there) or a T4 (current PyTorch)."
    )


def _cpu_stack(pins: StackSpec | None) -> Stack:
    framework = pins.framework if pins else "none"
    version_pin = _pin(pins.framework_version) if pins else None
    for name in ("driver", "cuda", "cudnn"):
        if pins is not None and _pin(getattr(pins, name)) is not None:
            raise UserError(f"stack.{name}: a CPU-only job (no resources.gpu) installs no {name}; remove the pin or request a GPU.")
    reasons = {
        "gpu": "No GPU requested: a CPU-only job.",
        "driver": "No GPU, so no NVIDIA driver.",
        "cuda": "No GPU, so no CUDA toolkit.",
        "cudnn": "No GPU, so no cuDNN.",
        "os_image": "Ubuntu 22.04, the default image for current stacks.",
    }
    pip: tuple[str, ...] = ()
    version: str | None = None
    if framework == "pytorch":
        version = version_pin or CPU_TORCH
        pip = (f"torch=={version}", "--index-url", TORCH_INDEX + "cpu")
        reasons["framework"] = f"PyTorch {version} CPU wheels (no CUDA libraries to download)."
    elif framework == "tensorflow":
        version = version_pin or CPU_TENSORFLOW
        pip = (f"tensorflow-cpu=={version}",)
        reasons["framework"] = f"TensorFlow {version} CPU-only package."
    else:
        reasons["framework"] = "No framework requested (framework: none): the job's setup installs what it needs."
    return Stack(
        gpu="", architecture="none", compute_capability="none", driver="none", cuda="none", cudnn="none",
        os_image="ubuntu-22.04", framework=framework, framework_version=version, ubuntu_version="22.04",
        cuda_repo="ubuntu2204", driver_packages=(), cuda_packages=(), cudnn_packages=(), framework_pip=pip,
        min_driver_version="none", reasons=reasons,
    )


def resolve_stack(gpu: str | None, pins: StackSpec | None = None) -> Stack:
    """The stack for `gpu` (canonical name or alias; None = CPU-only) honouring `pins` it can run.

    Raises UserError for an unknown GPU or for a pin outside the GPU's limits, with the limit and
    the way out in the message.
    """
    if gpu is None:
        return _cpu_stack(pins)
    from gpucloud.catalog import gpu_names, load_catalog

    try:
        model = load_catalog().gpu(gpu)
    except KeyError:
        raise UserError(f"Unknown GPU {gpu!r}. Known GPUs: {', '.join(gpu_names())}.") from None
    name, arch = model.name, model.architecture
    prof = _profile(arch)

    driver_pin = _pin(pins.driver) if pins else None
    cuda_pin = _pin(pins.cuda) if pins else None
    cudnn_pin = _pin(pins.cudnn) if pins else None
    framework = pins.framework if pins else "none"
    fw_pin = _pin(pins.framework_version) if pins else None

    if framework == "pytorch" and name in NO_PYTORCH:
        raise _k40_pytorch_error(name)

    cuda, cuda_reason = _choose_cuda(cuda_pin, driver_pin, name, arch, prof)
    branch, min_driver, driver_reason = _choose_driver(driver_pin, cuda, cuda_pin is not None, name, prof)
    cudnn, cudnn_reason = _choose_cudnn(cudnn_pin, cuda, name, prof)

    # NVIDIA publishes CUDA < 11.8 only for Ubuntu 20.04 and older; CUDA 13 dropped 20.04 (FACTS.md s3).
    ubuntu = prof.ubuntu
    os_reason = prof.reasons["os_image"]
    if prof is not KEPLER and _v(cuda) < _v("11.8"):
        ubuntu = "20.04"
        os_reason = f"Ubuntu 20.04: NVIDIA's repositories for CUDA {cuda} exist only for Ubuntu 20.04 and older."

    version: str | None = None
    pip: tuple[str, ...] = ()
    if framework == "pytorch":
        version, pip, fw_reason = _choose_torch(fw_pin, name, prof, cuda)
    elif framework == "tensorflow":
        version, pip, fw_reason = _choose_tensorflow(fw_pin, name, prof, branch)
    else:
        fw_reason = "No framework requested (framework: none): the job's setup installs what it needs."

    warnings = tuple(w for w in (GPU_WARNINGS.get(name),) if w)
    reasons = {
        "gpu": f"{name}: {arch}, compute capability {model.compute_capability} ({prof.name} stack).",
        "architecture": f"{arch} GPUs use the {prof.name} row of FACTS.md section 3.",
        "driver": driver_reason,
        "min_driver_version": f"CUDA {cuda} needs driver >= {MIN_DRIVER[cuda]} (CUDA release notes)."
        + (" (11.4 GA needed 470.42.01; the repository installs 11.4 Update 4, and 11.4 U3+ needs 470.82.01.)"
           if cuda == "11.4" else ""),
        "cuda": cuda_reason,
        "cudnn": cudnn_reason,
        "os_image": os_reason,
        "framework": fw_reason,
    }
    return Stack(
        gpu=name,
        architecture=arch,
        compute_capability=model.compute_capability,
        driver=str(branch),
        cuda=cuda,
        cudnn=cudnn,
        os_image=f"ubuntu-{ubuntu}",
        framework=framework,
        framework_version=version,
        ubuntu_version=ubuntu,
        cuda_repo="ubuntu" + ubuntu.replace(".", ""),
        driver_packages=_driver_packages(branch),
        cuda_packages=(f"cuda-toolkit-{cuda.replace('.', '-')}",),
        cudnn_packages=_cudnn_packages(cudnn, cuda),
        framework_pip=pip,
        min_driver_version=min_driver,
        reasons=reasons,
        warnings=warnings,
    )
