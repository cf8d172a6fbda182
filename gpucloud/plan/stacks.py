"""GPU architecture -> driver / CUDA / cuDNN / OS image / framework, with pin validation.

The data is the point of this module: the tables below restate docs/STACKS.md (with its
sources) so that a reviewer can check each number against the source, and the code only walks
them. Each GPU generation gets the newest stack that still supports it; a pin the GPU cannot run
is a `UserError` that states the limit and what to do instead, because a wrong combination would
otherwise surface an hour later as a VM that silently trains on the CPU.

The Stack dataclass (gpucloud/plan/stack_data.py) crosses the provider contract; keep its attributes.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gpucloud.errors import UserError
from gpucloud.plan.stack_data import (  # noqa: F401  (re-exported: the tables were defined here)
    COMPAT_FLOOR,
    CPU_TENSORFLOW,
    CPU_TORCH,
    CUDNN8_BUILDS,
    DRIVER_BRANCHES,
    GPU_WARNINGS,
    KEPLER,
    MAXWELL_VOLTA,
    MIN_CUDA,
    MIN_DRIVER,
    NO_PYTORCH,
    OPEN_MODULES_ONLY,
    PINNING_FROM,
    PROFILES,
    TF_NO_KERNELS,
    TORCH_INDEX,
    TORCH_WHEELS,
    TURING_PLUS,
    UNSUFFIXED_FROM,
    Profile,
    Stack,
)

if TYPE_CHECKING:
    from gpucloud.catalog.models import GpuModel
    from gpucloud.spec.load import StackSpec


# --------------------------------------------------------------------------------------------------
# The resolver.
# --------------------------------------------------------------------------------------------------


def version_key(version: str) -> tuple[int, ...]:
    """ "470.82.01" -> (470, 82, 1), for ordering versions numerically."""
    return tuple(int(p) for p in re.findall(r"\d+", version))


def pin_value(value: str | None) -> str | None:
    """None for "auto"/empty, else the stripped pin."""
    if value is None:
        return None
    value = str(value).strip()
    return None if value.lower() in ("", "auto") else value


def profile_for(architecture: str) -> Profile:
    for p in PROFILES:
        if architecture in p.architectures:
            return p
    raise UserError(f"No software stack is defined for the {architecture} architecture.")  # pragma: no cover


def driver_apt_packages(branch: int, modules: str = "proprietary") -> tuple[str, ...]:
    """apt arguments for the driver: `cuda-drivers` (proprietary modules) or `nvidia-open` (open modules)."""
    name = "nvidia-open" if modules == "open" else "cuda-drivers"
    if branch >= UNSUFFIXED_FROM:
        return (f"{name}={branch}.*",)  # no suffix from 590: lock the branch by version
    return (f"{name}-{branch}",)


def driver_lock_packages(branch: int) -> tuple[str, ...]:
    """The version-locking package that holds `branch` (docs/STACKS.md, "Driver branch pins")."""
    return (f"nvidia-driver-pinning-{branch}",) if branch >= PINNING_FROM else ()


def choose_kernel_modules(arch: str, branch: int, gpu: str) -> tuple[str, str]:
    """("open"|"proprietary", reason); a Blackwell GPU on a branch older than R570 is an error."""
    floor = OPEN_MODULES_ONLY.get(arch)
    if floor is None:
        return "proprietary", f"{arch} GPUs run on the proprietary kernel modules (cuda-drivers packages)."
    if branch < floor:
        raise UserError(
            f"stack.driver: {gpu} ({arch}) needs driver R{floor} or newer with the open kernel modules; "
            f'R{branch} cannot drive it. Pin "{floor}" or newer, or leave it "auto".'
        )
    return "open", (
        f"{arch} GPUs need the open kernel modules (nvidia-open packages, R{floor}+); "
        "the proprietary cuda-drivers modules do not drive them."
    )


def _variant_cuda(variant: str) -> str:
    """ "cu117" -> "11.7", "cu130" -> "13.0"."""
    digits = variant[2:]
    return f"{digits[:2]}.{digits[2:]}"


def _check_cuda_pin(cuda: str, gpu: str, arch: str, prof: Profile) -> None:
    if cuda not in MIN_DRIVER:
        raise UserError(
            f"stack.cuda: {cuda!r} is not a CUDA version gpucloud can check. Pin one of "
            f'{", ".join(MIN_DRIVER)} (the toolkits whose minimum driver is known), or leave it "auto".'
        )
    if (
        prof.max_driver is not None
        and version_key(MIN_DRIVER[cuda])[0] > prof.max_driver
        and version_key(cuda)[0] == version_key(prof.max_cuda)[0]
    ):
        raise UserError(
            f"stack.cuda: {gpu} cannot use the CUDA {cuda} toolkit: it needs driver >= {MIN_DRIVER[cuda]}, but "
            f"R{prof.max_driver} is the last driver branch for {' / '.join(prof.architectures)} GPUs, and "
            f"R{prof.max_driver} "
            f'runs CUDA {prof.max_cuda} natively. Pin {prof.max_cuda} or older, or leave it "auto".'
            + (
                " Framework wheels built for CUDA 11.5-11.7 (e.g. PyTorch cu117) still run on R470 by minor-version "
                "compatibility; only the system toolkit is limited."
                if prof is KEPLER
                else ""
            )
        )
    if version_key(cuda) > version_key(prof.max_cuda):
        if prof is KEPLER:
            hint = (
                ' Leave cuda "auto" (11.4) or pin 11.4 or older; framework wheels built for CUDA 11.5-11.7 '
                "(e.g. PyTorch cu117) still run on R470."
            )
        else:
            hint = f' Pin {prof.max_cuda} or older, or leave it "auto" ({prof.cuda}).'
        raise UserError(f"stack.cuda: {gpu} cannot use CUDA {cuda}: {prof.max_cuda_reason}.{hint}")
    floor = MIN_CUDA.get(arch)
    if floor and version_key(cuda) < version_key(floor):
        raise UserError(
            f"stack.cuda: {gpu} ({arch}) needs CUDA {floor} or newer; CUDA {cuda} has no code for it. "
            f'Leave cuda "auto" ({prof.cuda}).'
        )


def _choose_driver(pin: str | None, cuda: str, cuda_pinned: bool, gpu: str, prof: Profile) -> tuple[int, str, str]:
    """(branch, min driver, reason). Raises when a pinned driver cannot run the GPU or the CUDA."""
    need = MIN_DRIVER[cuda]
    if pin is None:
        branch = max(prof.driver, next(b for b in DRIVER_BRANCHES if b >= version_key(need)[0]))
        reason = prof.reasons["driver"]
        if branch != prof.driver:
            reason = f"R{branch}: the oldest branch that runs the pinned CUDA {cuda} (needs >= {need})."
        return branch, need, reason
    if not re.fullmatch(r"\d{3}(\.\d+){0,2}", pin):
        raise UserError(
            f"stack.driver: {pin!r} is not a driver branch or version. "
            'Use a branch such as "580" or a version such as "580.65.06".'
        )
    branch = version_key(pin)[0]
    if prof.max_driver is not None and branch > prof.max_driver:
        raise UserError(
            f"stack.driver: {gpu} cannot use driver {pin}: R{prof.max_driver} is the last driver branch that supports "
            f'{" / ".join(prof.architectures)} GPUs. Pin "{prof.max_driver}" or leave it "auto".'
        )
    # A branch pin ("535") means the newest driver of that branch; a full version is compared as given.
    runs = branch >= version_key(need)[0] if "." not in pin else version_key(pin) >= version_key(need)
    if not runs:
        raise UserError(
            f"stack.driver: driver {pin} is too old for CUDA {cuda}, which needs driver >= {need} "
            f"(CUDA release notes). Pin a newer driver, or {'an older CUDA' if cuda_pinned else 'pin an older cuda'} "
            f"whose minimum it meets: "
            + ", ".join(
                c
                for c, d in MIN_DRIVER.items()
                if (version_key(d)[0] <= branch if "." not in pin else version_key(d) <= version_key(pin))
            )
            + "."
        )
    min_version = pin if "." in pin else need
    return branch, min_version, f"R{branch} as pinned; it runs CUDA {cuda} (needs >= {need})."


def _choose_cuda(pin: str | None, driver_pin: str | None, gpu: str, arch: str, prof: Profile) -> tuple[str, str]:
    if pin is not None:
        _check_cuda_pin(pin, gpu, arch, prof)
        return pin, f"CUDA {pin} as pinned; {gpu} supports up to {prof.max_cuda}."
    if driver_pin is not None and re.fullmatch(r"\d{3}(\.\d+){0,2}", driver_pin):
        # Honour the driver pin: the default CUDA, or the newest one that driver runs.
        branch = version_key(driver_pin)[0]
        fits = [
            c
            for c, d in MIN_DRIVER.items()
            if version_key(c) <= version_key(prof.cuda)
            and (version_key(d)[0] <= branch if "." not in driver_pin else version_key(d) <= version_key(driver_pin))
        ]
        floor = MIN_CUDA.get(arch)
        fits = [c for c in fits if not floor or version_key(c) >= version_key(floor)]
        if fits and fits[-1] != prof.cuda:
            return fits[-1], (
                f"CUDA {fits[-1]}: the newest toolkit the pinned driver {driver_pin} runs "
                f"(default would be {prof.cuda})."
            )
    return prof.cuda, prof.reasons["cuda"]


def _cudnn_packages(cudnn: str, cuda: str) -> tuple[str, ...]:
    """apt arguments for cuDNN; cuDNN 8 versions carry their CUDA build, e.g. 8.2.4.15-1+cuda11.4."""
    if cudnn.startswith("8."):
        build = CUDNN8_BUILDS.get(cudnn)
        return (f"libcudnn8={cudnn}.*-1+cuda{build}",) if build else (f"libcudnn8={cudnn}.*",)
    package = f"cudnn9-cuda-{cuda.split('.')[0]}"
    return (package,) if cudnn == "9" else (f"{package}={cudnn}.*",)


def _cuda_major_named(reason: str, cuda: str) -> str:
    """A cuDNN 9 reason written for the profile's CUDA 12 default, told for the stack's own CUDA major
    (a CUDA 11.8 pin installs cudnn9-cuda-11, and the reason must say so)."""
    major = cuda.split(".")[0]
    return reason.replace("cudnn9-cuda-12", f"cudnn9-cuda-{major}").replace("for CUDA 12", f"for CUDA {major}")


def _choose_cudnn(pin: str | None, cuda: str, gpu: str, prof: Profile) -> tuple[str, str]:
    if pin is None:
        return prof.cudnn, _cuda_major_named(prof.reasons["cudnn"], cuda)
    if not prof.cudnn_ok.match(pin):
        raise UserError(
            f"stack.cudnn: {gpu} cannot use cuDNN {pin}: {prof.cudnn_limit}. "
            f'Pin a version in that range or leave it "auto" ({prof.cudnn}).'
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
    if pin is None:
        return _default_torch(_minor(prof.torch_default), gpu, prof, cuda)
    return _pinned_torch(pin, gpu, prof, cuda)


def _torch_variant(minor: str, prof: Profile, cuda: str) -> str | None:
    """The wheel variant (cuXYZ) of PyTorch `minor` for the stack's CUDA, None when none shares its major."""
    cuda_major = cuda.split(".")[0]
    variants = [
        v
        for v in TORCH_WHEELS[minor][1]
        if _variant_cuda(v).split(".")[0] == cuda_major
        and (prof.torch_max_variant is None or version_key(v[2:]) <= version_key(prof.torch_max_variant[2:]))
    ]
    if not variants:
        return None
    exact = [v for v in variants if _variant_cuda(v) == cuda]
    older = [v for v in variants if version_key(_variant_cuda(v)) <= version_key(cuda)]
    # Prefer the stack's own CUDA, then the newest older one, then the closest newer one
    # (which runs by minor-version compatibility).
    return (exact or older or variants[:1])[-1]


def _default_torch(default: str, gpu: str, prof: Profile, cuda: str) -> tuple[str, tuple[str, ...], str]:
    """The profile's PyTorch when a wheel fits the stack's CUDA, else the newest release that has one."""
    cuda_major = cuda.split(".")[0]
    order = [default] + [m for m in reversed(TORCH_WHEELS) if m != default]
    for minor in order:
        if prof.torch_max and version_key(minor) > version_key(prof.torch_max):
            continue
        variant = _torch_variant(minor, prof, cuda)
        if variant:
            version = TORCH_WHEELS[minor][0]
            reason = (
                prof.reasons["pytorch"]
                if minor == default
                else (
                    f"PyTorch {version}+{variant}: the newest release with wheels for CUDA {cuda_major}.x "
                    f"that {gpu} can run."
                )
            )
            return version, (f"torch=={version}", "--index-url", TORCH_INDEX + variant), reason
    raise UserError(f'stack.framework: no official PyTorch wheel supports {gpu} with CUDA {cuda}. Leave cuda "auto".')


def _pinned_torch(pin: str, gpu: str, prof: Profile, cuda: str) -> tuple[str, tuple[str, ...], str]:
    """The pinned PyTorch, refused when gpucloud knows no wheels for it, the GPU cannot run it, or no
    wheel shares the stack's CUDA major."""
    minor = _minor(pin)
    if minor not in TORCH_WHEELS:
        raise UserError(
            f"stack.framework_version: PyTorch {pin} is not one gpucloud knows wheels for. "
            f'Known: {", ".join(TORCH_WHEELS)} (or leave it "auto").'
        )
    if prof.torch_max and version_key(minor) > version_key(prof.torch_max):
        why = prof.reasons.get("pytorch_max") or (
            f"PyTorch {prof.torch_max} ({TORCH_WHEELS[prof.torch_max][0]}+{prof.torch_max_variant}) is the newest "
            "release whose wheels support it"
        )
        raise UserError(
            f"stack.framework_version: PyTorch {pin} does not fully work on {gpu}: {why}. "
            f'Pin {TORCH_WHEELS[prof.torch_max][0]} or older, or leave it "auto".'
        )
    variant = _torch_variant(minor, prof, cuda)
    if variant is None:
        raise UserError(
            f"stack.framework_version: PyTorch {pin} has no wheel for CUDA {cuda.split('.')[0]}.x that {gpu} can run "
            f"(its wheels: {', '.join(TORCH_WHEELS[minor][1])}). Pin another PyTorch or another cuda."
        )
    version = pin if pin.count(".") >= 2 else TORCH_WHEELS[minor][0]
    reason = (
        f"PyTorch {version} as pinned, {variant} wheel "
        "(same CUDA major as the stack; runs by minor-version compatibility)."
    )
    return version, (f"torch=={version}", "--index-url", TORCH_INDEX + variant), reason


def _choose_tensorflow(
    pin: str | None, gpu: str, arch: str, prof: Profile, driver_branch: int
) -> tuple[str, tuple[str, ...], str]:
    if arch in TF_NO_KERNELS:
        raise UserError(
            f"stack.framework: TensorFlow cannot use the {gpu}: {TF_NO_KERNELS[arch]}. Use framework: "
            "pytorch (its cu126 wheels carry sm_50), or a Pascal or newer GPU."
        )
    version = pin or prof.tf_default
    minor = _minor(version)
    low, high = prof.tf_range
    if not (version_key(low) <= version_key(minor) <= version_key(high)):
        raise UserError(
            f"stack.framework_version: TensorFlow {version} does not fit {gpu}: gpucloud supports TensorFlow "
            f"{low}-{high} "
            f"on {prof.name} GPUs"
            + (
                " (2.11 is the last release with Kepler kernels)"
                if prof is KEPLER
                else " (the releases with the [and-cuda] pip extra)"
            )
            + '. Leave it "auto".'
        )
    if pin and pin.count(".") < 2:
        version = f"{pin}.0"
    if prof is KEPLER:
        pinned = f"TensorFlow {version} as pinned (uses the system CUDA 11 / cuDNN 8)."
        return version, (f"tensorflow=={version}",), prof.reasons["tensorflow"] if not pin else pinned
    if driver_branch < version_key(COMPAT_FLOOR["12"])[0]:
        raise UserError(
            f"stack.driver: TensorFlow's CUDA 12 wheels need driver >= {COMPAT_FLOOR['12']}; "
            f"R{driver_branch} is too old."
        )
    pinned = f"TensorFlow {version} as pinned, with its CUDA libraries from the [and-cuda] extra."
    reason = prof.reasons["tensorflow"] if not pin else pinned
    return version, (f"tensorflow[and-cuda]=={version}",), reason


def _k40_pytorch_error(gpu: str) -> UserError:
    return UserError(
        f"stack.framework: PyTorch has had no official wheels for the Tesla {gpu} (Kepler, sm_35) since about release "
        "1.2, "
        "so gpucloud cannot install one. What you can do: (1) keep framework: none and build PyTorch from source in "
        "`setup:` with TORCH_CUDA_ARCH_LIST=3.5 against the stack's CUDA 11.4 (slow, but it works); (2) use "
        "framework: none "
        "and install your own build or wheel; (3) use framework: tensorflow (2.4-2.11 still ship sm_35 kernels); or "
        f"(4) pick a K80 (PyTorch {KEPLER.torch_default}+{KEPLER.torch_max_variant} runs there) or a T4 (current "
        "PyTorch)."
    )


def cpu_stack(pins: StackSpec | None) -> Stack:
    framework = pins.framework if pins else "none"
    version_pin = pin_value(pins.framework_version) if pins else None
    for name in ("driver", "cuda", "cudnn"):
        if pins is not None and pin_value(getattr(pins, name)) is not None:
            raise UserError(
                f"stack.{name}: a CPU-only job (no resources.gpu) installs no {name}; remove the pin or request a GPU."
            )
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
        gpu="",
        architecture="none",
        compute_capability="none",
        driver="none",
        cuda="none",
        cudnn="none",
        os_image="ubuntu-22.04",
        framework=framework,
        framework_version=version,
        ubuntu_version="22.04",
        cuda_repo="ubuntu2204",
        driver_packages=(),
        cuda_packages=(),
        cudnn_packages=(),
        framework_pip=pip,
        min_driver_version="none",
        reasons=reasons,
    )


def gpu_model(gpu: str) -> GpuModel:
    """The catalog's GPU for a canonical name or alias; an unknown one is bad input naming the known."""
    from gpucloud.catalog import gpu_names, load_catalog

    try:
        return load_catalog().gpu(gpu)
    except KeyError:
        raise UserError(f"Unknown GPU {gpu!r}. Known GPUs: {', '.join(gpu_names())}.") from None


def _pinned(pins: StackSpec | None) -> tuple[str | None, str | None, str | None, str, str | None]:
    """(driver, cuda, cudnn, framework, framework version) as the job pins them; None: "auto"."""
    if not pins:
        return None, None, None, "none", None
    return (
        pin_value(pins.driver),
        pin_value(pins.cuda),
        pin_value(pins.cudnn),
        pins.framework,
        pin_value(pins.framework_version),
    )


def resolve_stack(gpu: str | None, pins: StackSpec | None = None) -> Stack:
    """The stack for `gpu` (canonical name or alias; None = CPU-only) honouring `pins` it can run.

    Raises UserError for an unknown GPU or for a pin outside the GPU's limits, with the limit and
    the way out in the message.
    """
    if gpu is None:
        return cpu_stack(pins)
    model = gpu_model(gpu)
    name, arch = model.name, model.architecture
    prof = profile_for(arch)
    driver_pin, cuda_pin, cudnn_pin, framework, fw_pin = _pinned(pins)
    if framework == "pytorch" and name in NO_PYTORCH:
        raise _k40_pytorch_error(name)
    cuda, cuda_reason = _choose_cuda(cuda_pin, driver_pin, name, arch, prof)
    branch, min_driver, driver_reason = _choose_driver(driver_pin, cuda, cuda_pin is not None, name, prof)
    cudnn, cudnn_reason = _choose_cudnn(cudnn_pin, cuda, name, prof)
    ubuntu, os_reason = _ubuntu_for(prof, cuda)
    version, pip, fw_reason = _choose_framework(framework, fw_pin, name, arch, prof, cuda, branch)
    modules, modules_reason = choose_kernel_modules(arch, branch, name)
    toolkit, toolkit_reason = _wants_toolkit(pins, framework, prof)
    reasons = {
        "gpu": f"{name}: {arch}, compute capability {model.compute_capability} ({prof.name} stack).",
        "architecture": f"{arch} GPUs use the {prof.name} row of docs/STACKS.md.",
        "driver": driver_reason,
        "min_driver_version": _min_driver_reason(cuda),
        "cuda": cuda_reason,
        "cudnn": cudnn_reason,
        "os_image": os_reason,
        "framework": fw_reason,
        "kernel_modules": modules_reason,
        "cuda_toolkit": toolkit_reason,
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
        driver_packages=driver_apt_packages(branch, modules),
        driver_lock=driver_lock_packages(branch),
        cuda_packages=(f"cuda-toolkit-{cuda.replace('.', '-')}",),
        cudnn_packages=_cudnn_packages(cudnn, cuda),
        framework_pip=pip,
        min_driver_version=min_driver,
        reasons=reasons,
        warnings=tuple(w for w in (GPU_WARNINGS.get(name),) if w),
        kernel_modules=modules,
        cuda_toolkit=toolkit,
        driver_pinned=driver_pin is not None,
    )


def _choose_framework(
    framework: str, pin: str | None, gpu: str, arch: str, prof: Profile, cuda: str, driver_branch: int
) -> tuple[str | None, tuple[str, ...], str]:
    """(version, pip args, reason) for the requested framework; no version and no wheels for none."""
    if framework == "pytorch":
        return _choose_torch(pin, gpu, prof, cuda)
    if framework == "tensorflow":
        return _choose_tensorflow(pin, gpu, arch, prof, driver_branch)
    return None, (), "No framework requested (framework: none): the job's setup installs what it needs."


def _min_driver_reason(cuda: str) -> str:
    """Why the driver floor is what it is: the CUDA release notes, with 11.4's update caveat."""
    return f"CUDA {cuda} needs driver >= {MIN_DRIVER[cuda]} (CUDA release notes)." + (
        " (11.4 GA needed 470.42.01; the repository installs 11.4 Update 4, and 11.4 U3+ needs 470.82.01.)"
        if cuda == "11.4"
        else ""
    )


def _ubuntu_for(prof: Profile, cuda: str) -> tuple[str, str]:
    """NVIDIA publishes CUDA < 11.8 only for Ubuntu 20.04 and older; CUDA 13 dropped 20.04 (docs/STACKS.md)."""
    if prof is not KEPLER and version_key(cuda) < version_key("11.8"):
        return "20.04", f"Ubuntu 20.04: NVIDIA's repositories for CUDA {cuda} exist only for Ubuntu 20.04 and older."
    return prof.ubuntu, prof.reasons["os_image"]


def _wants_toolkit(pins: StackSpec | None, framework: str, prof: Profile) -> tuple[bool, str]:
    """Whether the VM needs the system CUDA toolkit + cuDNN, and why."""
    if pins is not None and getattr(pins, "cuda_toolkit", False):
        return True, "The job asks for the system CUDA toolkit and cuDNN (stack.cuda_toolkit: true)."
    if framework == "tensorflow" and prof is KEPLER:
        return True, "TensorFlow 2.11 on Kepler loads the system CUDA 11 / cuDNN 8 libraries, so they are installed."
    return False, (
        "Not installed: the framework wheel bundles its CUDA runtime and cuDNN and needs only the driver; "
        "set stack.cuda_toolkit: true to get nvcc and the system cuDNN."
    )
