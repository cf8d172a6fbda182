"""The stack stages' config (CLI side): what the VM checks and installs, and the GPU it expects
(for a `container:` job also the engine and NVIDIA container toolkit of its host).

The agent's stack and gpu_verify stages (gpucloud/vm/agent/stack.py, gpu_check.py) read nothing
else, so this JSON-able dict is their whole contract with the CLI: the node's install plan
(gpucloud/vm/job_env.py `stack_context`), the GPU fields and the framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpucloud.plan.stack_data import CONTAINER_TOOLKIT_REPO
from gpucloud.vm.agent.gpu_check import gpu_tokens
from gpucloud.vm.job_env import stack_context

if TYPE_CHECKING:
    from gpucloud.contract.provider import Capabilities
    from gpucloud.plan.images import NodeStack
    from gpucloud.plan.planner import Candidate
    from gpucloud.plan.stacks import Stack

FRAMEWORKS = ("pytorch", "tensorflow")
# What `mode: mount` inputs need on the machine before the inputs stage (Debian/Ubuntu names):
# rclone, and fusermount3 for the FUSE mount (docs/DATA.md).
MOUNT_PACKAGES = ("rclone", "fuse3")


def stack_config(
    node: NodeStack, stack: Stack, candidate: Candidate, caps: Capabilities, *, mounts: bool = False
) -> dict[str, Any]:
    """Everything both stages need for one node: the install plan of its image (`node`), the pinned
    stack (driver/CUDA strings also name the stack in failure messages), the GPU model, count and
    name tokens nvidia-smi must show, how strict that check is, whether the provider installs a
    stack at all (hosts that bring their own driver do not), and with `mounts` (the job mounts a
    bucket folder) the packages that mount it, installed where missing: the inputs stage mounts
    before the job's own setup could install anything."""
    gpu_model = candidate.gpu or ""
    framework = stack.framework if stack.framework in FRAMEWORKS else "none"
    host = container_host(node)
    return {
        "skip_stack": not caps.install_stack,
        "driver": stack.driver,
        "cuda": stack.cuda,
        "cuda_repo": stack.cuda_repo,
        "framework": framework,
        "framework_version": stack.framework_version or "",
        "framework_pip": list(stack.framework_pip) if framework != "none" else [],
        "gpu_model": gpu_model,
        "gpu_count": int(candidate.gpu_count if gpu_model else 0),
        "gpu_tokens": gpu_tokens(gpu_model),
        "gpu_check": caps.gpu_check,
        **({"container": host} if host else {}),
        **({"mount_packages": list(MOUNT_PACKAGES)} if mounts else {}),
        **stack_context(node),
    }


def container_host(node: NodeStack) -> dict[str, Any]:
    """A `container:` job's host: the engine and NVIDIA container toolkit packages the stack stage
    installs where missing, and the toolkit's apt repository; {} for any other job."""
    if not (node.engine_packages or node.toolkit_packages):
        return {}
    return {
        "engine_packages": list(node.engine_packages),
        "toolkit_packages": list(node.toolkit_packages),
        "toolkit_repo": CONTAINER_TOOLKIT_REPO,
    }
