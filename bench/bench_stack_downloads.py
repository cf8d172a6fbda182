"""What a VM downloads and installs before the job's first line, per GPU generation.

"before": every package the old bootstrap installed on plain Ubuntu (driver, full CUDA toolkit,
cuDNN, framework wheel). "after": what gpucloud's stack stage installs now on the image
gpucloud/plan/images.py chooses (vendor image where one fits; toolkit/cuDNN only when asked).
"baked": the same disk booted again (what `image build` will produce): nothing.

Package lists come from the resolver and are exact. Sizes are approximate download sizes, each
labelled with where it comes from; see BENCHMARKS.md. Run: python bench/bench_stack_downloads.py
"""

from __future__ import annotations

import re

from gpucloud.plan.images import resolve_node
from gpucloud.plan.stacks import resolve_stack
from gpucloud.spec.load import StackSpec

# (pattern on the package / pip argument, MB, provenance)
SIZES: list[tuple[str, int, str]] = [
    (r"^nvidia-fabricmanager", 8, "packages.ubuntu.com: nvidia-fabricmanager-580 amd64, 8,032.6 kB"),
    (r"^(cuda-drivers|nvidia-open)", 350, "estimate: driver userspace + DKMS sources (NVIDIA's .run is ~300-400 MB)"),
    (r"^cuda-toolkit-11", 2500, "estimate: full CUDA 11.4 toolkit"),
    (r"^cuda-toolkit-12", 3000, "issue 13: the full cuda-toolkit-12-x is ~3 GB"),
    (r"^libcudnn8", 700, "estimate: cuDNN 8 runtime library"),
    (r"^cudnn9", 900, "estimate: cuDNN 9 runtime + headers"),
    (
        r"^torch==(1\.|2\.[0-1]\.)",
        2300,
        "estimate: one cu11x wheel bundling CUDA + cuDNN (torch 1.13.0+cu117 is 1.81 GB)",
    ),
    (r"^torch==", 3500, "estimate: ~0.9 GB torch wheel + ~2.5 GB nvidia-*-cu12 wheels it pulls"),
    (r"^tensorflow", 2500, "estimate: TF wheel + [and-cuda] nvidia wheels"),
]
CASES = [  # (generation, gpu, count, cloud, instance type)
    ("Kepler", "K80", 1, "aws", "p2.xlarge"),
    ("Volta", "V100", 1, "aws", "p3.2xlarge"),
    ("Turing", "T4", 1, "aws", "g4dn.xlarge"),
    ("Ampere (GRID)", "A10", 1, "azure", "Standard_NV36ads_A10_v5"),
    ("Ampere x8 NVSwitch", "A100-40GB", 8, "aws", "p4d.24xlarge"),
    ("Hopper x8 NVSwitch", "H100", 8, "azure", "Standard_ND96isr_H100_v5"),
    ("Blackwell x8 NVSwitch", "B200", 8, "aws", "p6-b200.48xlarge"),
]


def size_mb(item: str) -> int:
    for pattern, mb, _ in SIZES:
        if re.search(pattern, item):
            return mb
    return 0


def after_items(gpu: str, count: int, cloud: str, instance: str) -> tuple[str, list[str]]:
    """(image, what the stack stage installs on it) with the image's preinstalled parts subtracted."""
    stack = resolve_stack(gpu, StackSpec(framework="pytorch"))
    node = resolve_node(stack, cloud, instance, count)
    image = node.image
    items: list[str] = []
    has_driver = image is not None and image.modules in ("open", "proprietary") and image.driver != ""
    if node.driver_source == "apt" and not has_driver:
        items += node.driver_packages
    if node.fabric_manager and not (image and image.fabric_manager):
        items.append(f"nvidia-fabricmanager-{stack.driver}")
    items += [*node.cuda_packages, *node.cudnn_packages, stack.framework_pip[0]]
    return (image.name if image else "default"), items


def main() -> None:
    print("| generation | instance | before: installs (≈ MB) | image now | after: installs (≈ MB) | baked |")
    print("|---|---|---|---|---|---|")
    for generation, gpu, count, cloud, instance in CASES:
        stack = resolve_stack(gpu, StackSpec(framework="pytorch"))
        before = [*stack.driver_packages, *stack.cuda_packages, *stack.cudnn_packages, stack.framework_pip[0]]
        image, after = after_items(gpu, count, cloud, instance)
        fmt = lambda xs: ", ".join(xs) + f" (≈ {sum(size_mb(x) for x in xs):,})"  # noqa: E731
        print(f"| {generation} | {instance} | {fmt(before)} | {image} | {fmt(after)} | nothing (0) |")
    print("\nSizes:")
    for pattern, mb, source in SIZES:
        print(f"- `{pattern}` ≈ {mb} MB: {source}")


if __name__ == "__main__":
    main()
