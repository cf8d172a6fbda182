"""Which machine image a VM boots, and what its stack stage must still install.

`resolve_stack` (gpucloud/plan/stacks.py) answers "what does this GPU need"; this module answers "what
does this VM need on top of the image it boots". Both halves are data: `catalog/data/images.csv`
lists the vendor and plain images per cloud, CPU architecture and GPU generation, with what each
has preinstalled and its source; `catalog/data/vm_features.csv` marks the instance types that need
NVIDIA's fabric manager (8-GPU NVSwitch machines) or the GRID driver (vGPU partitions). Cloud names
appear only in those rows, so a new cloud is new rows, not new code. docs/STACKS.md explains the
facts behind both files.

The install plan is deliberately minimal: a framework wheel that bundles its CUDA runtime and
cuDNN needs only the driver, so the system toolkit and cuDNN are installed only when the stack
asks for them; on a vendor image with a fitting driver the stack stage installs nothing.
"""

from __future__ import annotations

import csv
import fnmatch
import functools
import io
import re
from dataclasses import dataclass
from importlib.resources import files
from typing import TYPE_CHECKING

from gpucloud.contract.provider import Image
from gpucloud.errors import InternalError
from gpucloud.plan.stack_data import COMPAT_FLOOR, PROFILES, PROPRIETARY_ONLY

if TYPE_CHECKING:
    from gpucloud.contract.provider import Candidate
    from gpucloud.plan.stacks import Stack

ARM64 = "arm64"
X86_64 = "x86_64"
# Path part of NVIDIA's apt repository per CPU architecture: arm64 servers use "sbsa" [V: docs/STACKS.md].
REPO_ARCH = {X86_64: "x86_64", ARM64: "sbsa"}
ANY_DRIVER_MAX = 999


@dataclass(frozen=True)
class NodeStack:
    """What one VM boots and what its stack stage checks and installs (the template's inputs)."""

    image: Image | None  # None: the provider's default / the host (local)
    cpu_arch: str
    repo_arch: str  # "x86_64" | "sbsa"
    driver_source: str  # "apt" | "grid" (wait for the cloud's extension) | "none" (no GPU)
    driver_min: int  # acceptable installed branches (inclusive)
    driver_max: int
    driver_packages: tuple[str, ...]
    fabric_manager: bool
    cuda_packages: tuple[str, ...]
    cudnn_packages: tuple[str, ...]
    reasons: dict[str, str]
    driver_lock: tuple[str, ...] = ()  # NVIDIA's version-locking package, installed before the driver
    extension_driver: str = ""  # GRID: the driver version the cloud's extension is pinned to
    # A `container:` job: the engine and NVIDIA container toolkit packages installed where missing, and
    # what the image is known to have (catalog/data/container_hosts.csv; "" when nothing is known).
    engine_packages: tuple[str, ...] = ()
    toolkit_packages: tuple[str, ...] = ()
    container_host: str = ""
    container_bytes: int = 0  # the `container:` image's size as the plan read it (0: unknown): its pull deadline

    def as_json(self) -> dict[str, object]:
        return {
            "image": self.image.as_json() if self.image else None,
            "cpu_arch": self.cpu_arch,
            "driver_source": self.driver_source,
            "driver_branches": [self.driver_min, self.driver_max],
            "fabric_manager": self.fabric_manager,
            "installs_if_missing": [
                *(["linux-headers-$(uname -r)", *self.driver_lock] if self.driver_packages else []),
                *self.driver_packages,
                *(["nvidia-fabricmanager (pinned to the driver)"] if self.fabric_manager else []),
                *self.cuda_packages,
                *self.cudnn_packages,
                *self.engine_packages,
                *self.toolkit_packages,
            ],
        }


@functools.cache
def _data(name: str) -> tuple[dict[str, str], ...]:
    """A shipped data file's rows, read once per process: a plan over a large catalog asks for the
    features of thousands of instance types (rows are read, never changed)."""
    text = files("gpucloud.catalog").joinpath("data", name).read_text(encoding="utf-8")
    return tuple(csv.DictReader(io.StringIO(text)))


def _split(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(";") if v.strip())


@functools.cache
def load_images() -> tuple[Image, ...]:
    """images.csv, validated: a bad row is a packaging bug (InternalError naming the line)."""
    out = []
    for line, row in enumerate(_data("images.csv"), start=2):
        try:
            out.append(
                Image(
                    cloud=row["cloud"],
                    name=row["name"],
                    cpu_arch=row["cpu_arch"],
                    gpu_archs=_split(row["gpu_archs"]),
                    vm_feature=row["vm_feature"],
                    ubuntu=row["ubuntu"],
                    modules=row["modules"],
                    driver=row["driver"],
                    cuda=_split(row["cuda"]),
                    cudnn=row["cudnn"] == "yes",
                    fabric_manager=row["fabric_manager"] == "yes",
                    extension=row["extension"],
                    found_by=row["found_by"],
                    ref=row["ref"],
                    source=row["source"],
                    checked=row["checked"],
                )
            )
        except KeyError as exc:
            raise InternalError(f"catalog/data/images.csv line {line}: column {exc} missing") from None
        if out[-1].cpu_arch not in REPO_ARCH or out[-1].modules not in ("", "open", "proprietary", "grid"):
            raise InternalError(f"catalog/data/images.csv line {line}: bad cpu_arch or modules")
    return tuple(out)


def vm_features(cloud: str, instance_type: str, gpu_count: int) -> frozenset[str]:
    """{"nvswitch", "grid"} as vm_features.csv says for this instance type and GPU count."""
    name = instance_type.lower()
    return frozenset(
        feature
        for rule_cloud, min_gpus, pattern, feature in _feature_rules()
        if rule_cloud == cloud and gpu_count >= min_gpus and pattern.match(name)
    )


@functools.cache
def _feature_rules() -> tuple[tuple[str, int, re.Pattern[str], str], ...]:
    """vm_features.csv with each instance pattern compiled once (fnmatch's rules, lower case)."""
    return tuple(
        (r["cloud"], int(r["min_gpus"]), re.compile(fnmatch.translate(r["instance_pattern"].lower())), r["feature"])
        for r in _data("vm_features.csv")
    )


def container_host(image: Image | None) -> str:
    """What a vendor image has for containers (engine, NVIDIA container toolkit), with its source; ""
    when container_hosts.csv knows nothing of it (the stack stage installs both there)."""
    name = image.name if image is not None else None
    for row in _data("container_hosts.csv"):
        if row["image"] == name:
            return f"{row['has']} [{row['source']}]"
    return ""


def cpu_arch_of(candidate: object) -> str:
    """The candidate's CPU architecture (offerings gain an `arch` column in the catalog issue)."""
    arch = str(getattr(candidate, "arch", "") or X86_64)
    return ARM64 if arch in (ARM64, "aarch64") else X86_64


def candidate_node(stack: Stack, candidate: Candidate, job_image: str = "auto") -> NodeStack:
    """Image + install plan of a candidate's machine (the image the plan chose for it, else the
    one `job_image` and the stack give): worked out by the plan (Plan.node_for), and given to the
    user-data and the image builder as it is."""
    return resolve_node(
        stack,
        candidate.cloud,
        candidate.instance_type,
        candidate.gpu_count,
        cpu_arch=cpu_arch_of(candidate),
        job_image=job_image,
        chosen=candidate.image,
    )


def _driver_range(stack: Stack) -> tuple[int, int]:
    """Installed driver branches that run this stack: from the CUDA minimum (or the pin) to the GPU's last."""
    if stack.driver == "none":
        return 0, ANY_DRIVER_MAX
    branch = int(stack.driver)
    if stack.driver_pinned:
        return branch, branch
    head = stack.min_driver_version.split(".")[0]
    low = int(head) if head.isdigit() else branch
    high = next((p.max_driver for p in PROFILES if stack.architecture in p.architectures and p.max_driver), None)
    return low, high or ANY_DRIVER_MAX


def _image_fits(
    image: Image, stack: Stack, cloud: str, cpu_arch: str, features: frozenset[str], branches: tuple[int, int]
) -> bool:
    """Rows for GRID VMs serve only those; a row with another feature (e.g. "hpc-image": the sizes
    an image is documented for) serves only instance types vm_features.csv marks with it."""
    grid = "grid" in features
    if image.cloud != cloud or image.cpu_arch != cpu_arch or (image.vm_feature == "grid") != grid:
        return False
    if image.vm_feature and image.vm_feature not in features:
        return False
    if "*" not in image.gpu_archs and stack.architecture not in image.gpu_archs:
        return False
    if image.ubuntu != stack.ubuntu_version:
        return False
    if image.modules in ("open", "proprietary") and image.driver:
        if not branches[0] <= int(image.driver) <= branches[1]:
            return False
    if image.modules == "open" and stack.architecture in PROPRIETARY_ONLY:
        return False
    return not (image.modules == "proprietary" and stack.kernel_modules == "open")


def choose_image(
    stack: Stack,
    cloud: str,
    instance_type: str,
    gpu_count: int,
    cpu_arch: str = X86_64,
    job_image: str = "auto",
    baked: Image | None = None,
) -> Image | None:
    """`image:` in the job file, else a baked image of this stack (gpucloud/plan/baked.py), else
    the first images.csv row that fits (vendor rows come first)."""
    if baked is not None and (not job_image or job_image == "auto"):
        return baked
    if job_image and job_image != "auto":
        return Image(
            cloud=cloud,
            name="job file",
            cpu_arch=cpu_arch,
            gpu_archs=("*",),
            vm_feature="",
            ubuntu=stack.ubuntu_version,
            modules="",
            driver="",
            cuda=(),
            cudnn=False,
            fabric_manager=False,
            extension="",
            found_by="job file",
            ref=job_image,
            source="`image:` in the job file; contents unknown, so the bootstrap checks every part",
            checked="",
        )
    features = vm_features(cloud, instance_type, gpu_count)
    if stack.driver == "none":
        features = features - {"grid"}
    branches = _driver_range(stack)
    for image in load_images():
        if _image_fits(image, stack, cloud, cpu_arch, features, branches):
            return image
    return None


def _grid_driver(stack: Stack, cloud: str, instance_type: str, low: int, reasons: dict[str, str]) -> tuple[str, int]:
    """A GRID size's driver comes from the cloud's extension: the version it is pinned to (empty: the
    latest) and the lowest driver the stack accepts there; its reason goes into `reasons`."""
    from gpucloud.catalog.drivers import extension_driver  # GRID sizes only: most plans never read it

    pinned = extension_driver(cloud, instance_type)
    reasons["driver"] = (
        "GRID VM: NVIDIA's vGPU guest driver comes from the cloud's driver extension "
        "(cuda-drivers does not work here); the bootstrap waits for it."
    )
    reasons["driver"] += f" Its driver is pinned to {pinned or 'the latest'}."
    major = (stack.container_cuda if stack.container_image else stack.cuda).split(".")[0]
    if not stack.cuda_toolkit and major in COMPAT_FLOOR:
        # The extension's GRID branch is pinned per size family (providers' choice, often older than
        # the stack's default); a framework wheel or an image runs on it by minor-version compatibility.
        low = min(low, int(COMPAT_FLOOR[major].split(".")[0]))
    return pinned, low


def resolve_node(
    stack: Stack,
    cloud: str,
    instance_type: str,
    gpu_count: int,
    *,
    cpu_arch: str = X86_64,
    job_image: str = "auto",
    baked: Image | None = None,
    chosen: Image | None = None,
) -> NodeStack:
    """Image + install plan of one VM (`chosen`: the image the plan already chose for it). The
    bootstrap still checks each part before it installs it."""
    features = vm_features(cloud, instance_type, gpu_count) if stack.driver != "none" else frozenset()
    image = chosen or choose_image(stack, cloud, instance_type, gpu_count, cpu_arch, job_image, baked)
    low, high = _driver_range(stack)
    reasons = {"image": image.summary() + f" [{image.source}]" if image else "the provider's default image"}
    pinned = ""  # GRID: the driver version the cloud's extension is pinned to on this size
    if stack.driver == "none":
        source = "none"
    elif "grid" in features:
        source = "grid"
        pinned, low = _grid_driver(stack, cloud, instance_type, low, reasons)
    else:
        source = "apt"
    fabric = "nvswitch" in features
    if fabric:
        reasons["fabric_manager"] = (
            "8-GPU NVSwitch machine: nvidia-fabricmanager at exactly the driver's version, "
            "started as a service, or CUDA fails to initialise."
        )
    if cpu_arch == ARM64:
        reasons["repo_arch"] = "arm64 machine: NVIDIA's repository path is sbsa, not x86_64."
    has = container_host(image) if stack.container_image else ""
    if stack.container_image:
        reasons["container"] = (
            f"the image has {has}; the stack stage checks and installs nothing it finds"
            if has
            else "docker.io from Ubuntu and NVIDIA's container toolkit (pinned), each only where missing"
        )
    return NodeStack(
        image=image,
        cpu_arch=cpu_arch,
        repo_arch=REPO_ARCH[cpu_arch],
        driver_source=source,
        driver_min=low,
        driver_max=high,
        driver_packages=stack.driver_packages if source == "apt" else (),
        driver_lock=stack.driver_lock if source == "apt" else (),
        extension_driver=pinned,
        fabric_manager=fabric,
        cuda_packages=stack.cuda_packages if stack.cuda_toolkit else (),
        cudnn_packages=stack.cudnn_packages if stack.cuda_toolkit else (),
        reasons=reasons,
        engine_packages=stack.engine_packages,
        toolkit_packages=stack.toolkit_packages if stack.driver != "none" else (),
        container_host=has,
    )
