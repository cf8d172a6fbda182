"""The planner's steps for a `container:` job, kept out of gpucloud/plan/planner.py so that a job
without a container imports none of it: the image's CUDA (once per plan), the stack of a single GPU
request (a refusal names the job file and the line of `container:`), the refusal when no GPU of a
wide request can run the image, and what `plan` shows about the container (`ContainerPlan`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpucloud.plan.container import ImageCuda, image_cuda
from gpucloud.plan.container_stack import ContainerPlan, ImageRefused, container_stack, container_where

if TYPE_CHECKING:
    from gpucloud.plan.images import NodeStack
    from gpucloud.plan.match import PlanStacks
    from gpucloud.plan.stack_data import Stack
    from gpucloud.spec.load import JobSpec


def image_of(spec: JobSpec, secrets: Mapping[str, str] | None, gpu_job: bool) -> ImageCuda:
    """The image's CUDA, from the best source that knows it (gpucloud/plan/container.py)."""
    assert spec.container is not None
    return image_cuda(spec.container, secrets, gpu_job=gpu_job)


def stack_of(spec: JobSpec, gpu: str | None, image: ImageCuda) -> Stack:
    """The host stack for a single GPU request; a GPU that cannot run the image stops the plan (exit 2)
    with the job file and the line of `container:`."""
    try:
        return container_stack(gpu, spec.stack, image)
    except ImageRefused as refused:
        raise refused.at(container_where(spec)) from None


def some_gpu_fits(spec: JobSpec, stacks: PlanStacks, gpus: frozenset[str]) -> None:
    """Alternatives and ranges: GPUs that cannot run the image are excluded with the reason; when that
    is every GPU the job accepts, say so here rather than as a list of excluded offerings."""
    reasons = stacks.refusals(gpus)
    if not reasons:
        return
    refused = [r for r in reasons if " cannot run " in r]
    if not refused:
        return  # the pins fit none of them: the planner's usual exclusions say why
    raise ImageRefused(
        f"{container_where(spec)}no GPU the job accepts can run the image:\n  - " + "\n  - ".join(reasons),
        refused[0],
        "Pick an image built for an older CUDA, or add a newer GPU to resources.gpu.",
    )


def describe(spec: JobSpec, image: ImageCuda, stack: Stack, node: NodeStack | None, install: bool) -> ContainerPlan:
    """What `plan` shows: the image and its CUDA, and the host stack of the first candidate's machine
    (`node`, its install plan; `install` False: a provider that uses the host as it is, e.g. this
    machine or an SSH host)."""
    warnings = list(image.warnings)
    if not install:
        host: dict[str, object] = {
            "driver": "the host's, as it is",
            "engine": "the host's docker or podman, as it is",
            "toolkit": "the host's NVIDIA container toolkit, as it is",
            "installs_if_missing": [],
            "why": "this provider installs nothing on the machine; the job's node checks the engine at boot",
        }
        return ContainerPlan(image, host, tuple(warnings))
    gpu = stack.driver != "none"
    has = node.container_host if node is not None else ""
    host = {
        "driver": f"R{stack.driver} (>= {stack.min_driver_version})" if gpu else "none (no GPU)",
        "engine": "the image's docker" if has else f"{', '.join(stack.engine_packages)} from Ubuntu, if missing",
        "toolkit": _toolkit(stack, has) if gpu else "none (no GPU)",
        "installs_if_missing": node.as_json()["installs_if_missing"] if node is not None else [],
        "image_has": has,
        "why": {
            "driver": stack.reasons["driver"],
            "engine and toolkit": (node.reasons.get("container") if node is not None else None)
            or stack.reasons.get("toolkit", stack.reasons.get("engine", "")),
        },
    }
    return ContainerPlan(image, host, tuple(warnings))


def _toolkit(stack: Stack, has: str) -> str:
    if has:
        return "the image's NVIDIA container toolkit"
    version = stack.toolkit_packages[0].split("=", 1)[1] if stack.toolkit_packages else ""
    return f"nvidia-container-toolkit {version} from NVIDIA's repository, if missing"
