"""The host stack of a `container:` job, and whether a GPU can run the image at all.

The image brings the CUDA runtime, cuDNN and the framework, so the host gets no framework wheel, no
CUDA toolkit and no cuDNN: only the driver (the GPU's branch, as for any job on it, raised when the
image's CUDA needs a newer one), a container engine and NVIDIA's container toolkit. What must hold
(docs/STACKS.md, "Containers"): the image's CUDA major still has code for the GPU's architecture
(CUDA 12 dropped Kepler, CUDA 13 dropped Maxwell, Pascal and Volta), and the driver branch is at
least the minor-version-compatibility floor of that major (11.x: 450.80.02, 12.x: 525.60.13,
13.x: 580). A GPU that fails either is refused with the reason (`ImageRefused`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpucloud.errors import UserError
from gpucloud.plan.stack_data import (
    COMPAT_FLOOR,
    CONTAINER_ENGINE_PACKAGES,
    CONTAINER_TOOLKIT_PACKAGES,
    CUDA_DROPPED,
    DRIVER_BRANCHES,
    GPU_WARNINGS,
    MIN_CUDA,
    MIN_DRIVER,
    Profile,
    Stack,
)
from gpucloud.plan.stacks import (
    choose_kernel_modules,
    cpu_stack,
    driver_apt_packages,
    driver_lock_packages,
    gpu_model,
    pin_value,
    profile_for,
    version_key,
)

if TYPE_CHECKING:
    from gpucloud.plan.container import ImageCuda
    from gpucloud.spec.load import JobSpec, StackSpec

# The newest CUDA each architecture group still has code for, said in a refusal's way out.
LAST_CUDA = {11: "11.x (R470 runs 11.4 natively, 11.5-11.8 by minor-version compatibility)", 12: "12.x"}
# The oldest GPUs that run an image of a CUDA major (the way out of a refusal, by the image's major).
NEWER_GPU = {12: "a Maxwell or newer GPU (Maxwell to Volta run CUDA 12.x)", 13: "a Turing or newer GPU"}


class ImageRefused(UserError):
    """A GPU that cannot run the image: `reason` is the short form a plan's exclusion shows."""

    def __init__(self, message: str, reason: str, hint: str) -> None:
        super().__init__(message, hint=hint)
        self.reason = reason

    def at(self, where: str) -> ImageRefused:
        """The same refusal, its message prefixed with the job file and the line of `container:`."""
        return ImageRefused(f"{where}{self.message}", self.reason, self.hint or "")


def container_where(spec: JobSpec) -> str:
    """ "job.yaml:7: container: " -- the job file and the line of its top-level `container:` key."""
    if spec.source is None:
        return "container: "
    try:
        lines = spec.source.read_text(encoding="utf-8").splitlines()
    except OSError:
        return f"{spec.source}: container: "
    line = next((i for i, text in enumerate(lines, 1) if re.match(r"container\s*:", text)), None)
    return f"{spec.source}:{line}: container: " if line else f"{spec.source}: container: "


def _refuse_pins(pins: StackSpec | None) -> None:
    """Pins of what the image brings make no sense with `container:`: say so instead of ignoring them."""
    if pins is None:
        return
    asked = [
        ("stack.framework", pins.framework != "none"),
        ("stack.framework_version", pin_value(pins.framework_version) is not None),
        ("stack.cuda", pin_value(pins.cuda) is not None),
        ("stack.cudnn", pin_value(pins.cudnn) is not None),
        ("stack.cuda_toolkit", bool(pins.cuda_toolkit)),
    ]
    for name, given in asked:
        if given:
            raise UserError(
                f"{name}: with `container:` the image brings CUDA, cuDNN and the framework; the host gets only "
                "the driver, a container engine and NVIDIA's container toolkit.",
                hint=f"Remove {name} (install what the job needs in `setup:`, which runs in the container, or use "
                "an image that has it).",
            )


def refusal(gpu: str, arch: str, prof: Profile, image: ImageCuda) -> ImageRefused | None:
    """Why `gpu` cannot run the image (its CUDA major dropped the architecture, or no driver branch of
    the GPU reaches that major's floor), or None."""
    major = image.major
    if major is None:
        return None
    dropped = CUDA_DROPPED.get(arch)
    last = (dropped - 1) if dropped else None
    if dropped is not None and major >= dropped:
        reason = f"{gpu} ({arch}) cannot run {image.label()}: CUDA {dropped} dropped {arch}"
        hint = (
            f"Pick an image built for CUDA {LAST_CUDA.get(last or 0, f'{last}.x')} or older, or "
            f"{NEWER_GPU.get(major, 'a newer GPU')}."
        )
        return ImageRefused(f"{reason}; no driver can change that. {_how(image)}", reason, hint)
    floor = COMPAT_FLOOR.get(str(major))
    if floor and prof.max_driver is not None and version_key(floor)[0] > prof.max_driver:
        reason = (
            f"{gpu} ({arch}) cannot run {image.label()}: CUDA {major}.x needs driver >= {floor} and "
            f"R{prof.max_driver} is the last branch for {arch}"
        )
        hint = "Pick an image built for an older CUDA, or a newer GPU."
        return ImageRefused(f"{reason}. {_how(image)}", reason, hint)
    return None


def _how(image: ImageCuda) -> str:
    return f"(CUDA {image.cuda} from {image.source}: {image.detail})"


def _native_min(cuda: str) -> str | None:
    """The lowest driver that runs `cuda` natively: its row of MIN_DRIVER, else the next known
    toolkit of the same major (an upper bound), else None (beyond the table)."""
    major = cuda.split(".")[0]
    known = sorted(
        (v for v in MIN_DRIVER if v.split(".")[0] == major and version_key(v) >= version_key(cuda)), key=version_key
    )
    return MIN_DRIVER[known[0]] if known else None


def _driver(pin: str | None, image: ImageCuda, gpu: str, prof: Profile) -> tuple[int, str, str]:
    """(branch, lowest driver that runs the image, reason): the GPU's own branch, raised when the
    image's CUDA needs a newer one the GPU supports; a pin is honoured if it reaches the floor."""
    cuda = image.cuda or ""
    major = cuda.split(".")[0]
    floor = COMPAT_FLOOR.get(major) if cuda else None
    native = _native_min(cuda) if cuda else None
    if pin is not None:
        return _pinned(pin, image, gpu, prof, floor)
    branch = prof.driver
    raised = False
    if native:
        want = next((b for b in DRIVER_BRANCHES if b >= version_key(native)[0]), None)
        if want is not None and want > branch and (prof.max_driver is None or want <= prof.max_driver):
            branch, raised = want, True
    if native and branch >= version_key(native)[0]:
        how = "the oldest branch that runs it" if raised else f"the {prof.name} default for {gpu}"
        return (
            branch,
            native,
            (
                f"R{branch} ({how}) runs the image's CUDA {cuda} natively (CUDA {cuda} needs >= {native}); "
                "the image brings CUDA itself."
            ),
        )
    if floor:
        return (
            branch,
            floor,
            (
                f"R{branch}, the last branch for {gpu}, runs the image's CUDA {cuda} by minor-version compatibility "
                f"({major}.x on >= {floor}; no JIT of PTX newer than the driver)."
            ),
        )
    if cuda and int(major) < min(int(k) for k in COMPAT_FLOOR):
        return branch, str(branch), f"R{branch}: a driver runs applications of every older CUDA, {cuda} included."
    what = f"CUDA {cuda}, beyond gpucloud's driver tables" if cuda else "a CUDA no source named"
    return branch, str(branch), f"R{branch}, the {prof.name} default for {gpu}; the image needs {what}, not checked."


def _pinned(pin: str, image: ImageCuda, gpu: str, prof: Profile, floor: str | None) -> tuple[int, str, str]:
    """A driver pin with a container: a branch or version the GPU supports that reaches the image's floor."""
    if not re.fullmatch(r"\d{3}(\.\d+){0,2}", pin):
        raise UserError(
            f"stack.driver: {pin!r} is not a driver branch or version.",
            hint='Use a branch such as "580" or a version such as "580.65.06".',
        )
    branch = version_key(pin)[0]
    if prof.max_driver is not None and branch > prof.max_driver:
        raise UserError(
            f"stack.driver: {gpu} cannot use driver {pin}: R{prof.max_driver} is the last branch for it.",
            hint=f'Pin "{prof.max_driver}" or leave it "auto".',
        )
    # A branch pin means the newest driver of that branch; a full version is compared as given.
    if floor and not (branch >= version_key(floor)[0] if "." not in pin else version_key(pin) >= version_key(floor)):
        raise UserError(
            f"stack.driver: driver {pin} cannot run {image.label()}: CUDA {image.major}.x needs a driver >= {floor} "
            "even by minor-version compatibility.",
            hint='Pin a newer driver, or leave it "auto".',
        )
    return branch, pin if "." in pin else (floor or str(branch)), f"R{branch} as pinned; it runs {image.label()}."


def container_stack(gpu: str | None, pins: StackSpec | None, image: ImageCuda) -> Stack:
    """The driver-only host stack for `gpu` (None: a CPU-only job, engine only). Raises ImageRefused
    when the GPU cannot run the image, UserError for pins that make no sense with a container."""
    _refuse_pins(pins)
    if gpu is None:
        return _cpu_host(image)
    model = gpu_model(gpu)
    name, arch = model.name, model.architecture
    prof = profile_for(arch)
    refused = refusal(name, arch, prof, image)
    if refused is not None:
        raise refused
    branch, min_driver, driver_reason = _driver(pin_value(pins.driver) if pins else None, image, name, prof)
    modules, modules_reason = choose_kernel_modules(arch, branch, name)
    warnings = _image_warnings(name, arch, image)
    ubuntu = prof.ubuntu
    reasons = {
        "gpu": f"{name}: {arch}, compute capability {model.compute_capability}; {image.label()} runs in a container.",
        "architecture": f"{arch} GPUs use the {prof.name} row of docs/STACKS.md (driver branches).",
        "driver": driver_reason,
        "min_driver_version": f"the lowest driver that runs the image's CUDA {image.cuda or '(unknown)'}.",
        "cuda": f"Not on the host: the image brings CUDA {image.cuda or '(unknown)'} ({image.source}: {image.detail}).",
        "cudnn": "Not on the host: the image brings its own.",
        "os_image": prof.reasons["os_image"],
        "framework": "Not on the host: the image brings the framework.",
        "kernel_modules": modules_reason,
        "cuda_toolkit": "Not installed: the image brings its CUDA libraries; the host needs only the driver.",
        **_host_reasons(),
    }
    return Stack(
        gpu=name,
        architecture=arch,
        compute_capability=model.compute_capability,
        driver=str(branch),
        cuda="none",
        cudnn="none",
        os_image=f"ubuntu-{ubuntu}",
        framework="none",
        framework_version=None,
        ubuntu_version=ubuntu,
        cuda_repo="ubuntu" + ubuntu.replace(".", ""),
        driver_packages=driver_apt_packages(branch, modules),
        driver_lock=driver_lock_packages(branch),
        cuda_packages=(),
        cudnn_packages=(),
        framework_pip=(),
        min_driver_version=min_driver,
        reasons=reasons,
        warnings=tuple(warnings),
        kernel_modules=modules,
        driver_pinned=bool(pins and pin_value(pins.driver)),
        container_image=image.image,
        container_cuda=image.cuda or "unknown",
        engine_packages=CONTAINER_ENGINE_PACKAGES,
        toolkit_packages=CONTAINER_TOOLKIT_PACKAGES,
    )


def _image_warnings(name: str, arch: str, image: ImageCuda) -> list[str]:
    """The GPU's own warning, and one when the image's CUDA is older than the architecture needs."""
    warnings = [w for w in (GPU_WARNINGS.get(name),) if w]
    floor = MIN_CUDA.get(arch)
    if image.cuda and floor and version_key(image.cuda) < version_key(floor):
        warnings.append(
            f"{name} ({arch}) is newer than the image's CUDA {image.cuda} ({arch} needs {floor}+): the image's "
            "libraries may have no kernels for it (only PTX they carry can be compiled for it at start-up)."
        )
    return warnings


def _host_reasons() -> dict[str, str]:
    return {
        "engine": "A container engine: docker or podman where the image has one, else Ubuntu's docker.io.",
        "toolkit": "NVIDIA's container toolkit (pinned) gives the container the GPUs and the host's driver "
        "libraries: `nvidia-ctk runtime configure` for docker, a CDI spec (`nvidia-ctk cdi generate`) for podman.",
    }


def _cpu_host(image: ImageCuda) -> Stack:
    """A CPU-only container job: the planner's CPU stack with no framework (the image brings it); the
    host needs an engine."""
    base = cpu_stack(None)
    reasons = {
        **base.reasons,
        "gpu": f"No GPU requested: {image.image} runs on the CPU.",
        "cuda": "No GPU; the image brings whatever it has.",
        "cudnn": "No GPU.",
        "framework": "Not on the host: the image brings the framework.",
        "engine": _host_reasons()["engine"],
    }
    return replace(
        base,
        reasons=reasons,
        container_image=image.image,
        container_cuda=image.cuda or "unknown",
        engine_packages=CONTAINER_ENGINE_PACKAGES,
    )


@dataclass(frozen=True)
class ContainerPlan:
    """What `plan` says about the container: the image, its CUDA and where that came from, and the host
    stack of the first candidate's machine (`host`, from gpucloud/plan/images.py's NodeStack)."""

    image: ImageCuda
    host: dict[str, object]
    warnings: tuple[str, ...] = ()

    def as_json(self) -> dict[str, object]:
        return {
            "image": self.image.image,
            "registry": self.image.registry,
            "cuda": self.image.cuda,
            "cuda_source": self.image.source,
            "cuda_detail": self.image.detail,
            "size_bytes": self.image.size_bytes or None,
            "host_stack": self.host,
            "warnings": list(self.warnings),
        }
