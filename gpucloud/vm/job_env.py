"""The job-config helpers the CLI side of the VM agent needs: the log/heartbeat/barrier times, the
stack stage's view of the node's install plan (the plan works it out), the GPU fields nvidia-smi
must show, the GPU sampler's settings, the check of the job's `env` names and the container the
steps run in (docs/INTERNALS.md, "VM agent").
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpucloud.errors import UserError
from gpucloud.vm.env import reserved_env_names

if TYPE_CHECKING:
    from gpucloud.contract.provider import Capabilities
    from gpucloud.plan.images import NodeStack
    from gpucloud.spec.load import JobSpec

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
GPU_SAMPLE_ENV = "GPUCLOUD_GPU_SAMPLE_S"  # seconds between GPU samples (the simulators shorten it)
DEFAULT_GPU_SAMPLE_S = 5.0
# The image builder's `run` (gpucloud/run/bake.py): a marker that flushes the disk and waits for the snapshot.
BUILDER_RUN = 'sync; echo "gpucloud image builder: stack installed, waiting for the snapshot"; exec sleep 86400'


def quote(value: object) -> str:
    """shlex.quote, always in quotes (shellcheck reads a bare `r-12` as arithmetic)."""
    q = shlex.quote(str(value))
    return q if q.startswith("'") else f"'{q}'"


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    """The job's env as the agent passes it to the job, each name checked: a valid variable name,
    not one the node keeps for itself (gpucloud/vm/env.py), no NUL in a value."""
    out: dict[str, str] = {}
    for key, value in env.items():
        if not _ENV_KEY.match(key):
            raise UserError(
                f"env: {key!r} is not a valid variable name.", hint="Use letters, digits and _ (not first)."
            )
        if key in reserved_env_names() or key.startswith("BASH"):
            raise UserError(
                f"env: {key} is a variable that the shell or the VM agent owns; it cannot be set for the job.",
                hint="Choose another name.",
            )
        value = str(value)
        if "\0" in value:
            raise UserError(f"env.{key}: a NUL character cannot be passed through the environment.")
        out[key] = value
    return out


def gpu_sampling(spec: JobSpec, gpu_count: int) -> tuple[float, int]:
    """How often the node samples its GPUs (0: no GPU, no sampler) and the job's idle timeout."""
    if not gpu_count:
        return 0.0, 0
    try:
        every = float(os.environ.get(GPU_SAMPLE_ENV) or DEFAULT_GPU_SAMPLE_S)
    except ValueError:
        every = DEFAULT_GPU_SAMPLE_S
    return max(every, 0.2), int(spec.resources.idle_timeout or 0)


def timings(
    caps: Capabilities,
    log_interval: float | None,
    heartbeat_interval: float | None,
    barrier_timeout: float | None,
    master_port: int,
) -> tuple[float, float, float]:
    """The log/heartbeat/barrier times (the provider's defaults where not given), checked."""
    log_interval = caps.log_interval if log_interval is None else log_interval
    heartbeat_interval = caps.heartbeat_interval if heartbeat_interval is None else heartbeat_interval
    barrier_timeout = caps.barrier_timeout if barrier_timeout is None else barrier_timeout
    if log_interval <= 0 or heartbeat_interval <= 0:
        raise ValueError("log_interval and heartbeat_interval must be positive")
    if not 1 <= int(master_port) <= 65535:
        raise ValueError(f"master_port {master_port} outside 1..65535")
    if barrier_timeout <= 0:
        raise ValueError("barrier_timeout must be positive")
    if caps.gpu_check not in ("strict", "warn"):
        raise ValueError(f"gpu_check must be 'strict' or 'warn', not {caps.gpu_check!r}")
    return log_interval, heartbeat_interval, barrier_timeout


def stack_context(node: NodeStack) -> dict[str, object]:
    """The stack stage's values: what to check, and what to install if missing."""
    return {
        "driver_source": node.driver_source,
        "driver_min": node.driver_min,
        "driver_max": node.driver_max,
        "driver_packages": list(node.driver_packages),
        "driver_lock": list(node.driver_lock),
        "extension": node.image.extension if node.image else "",
        "extension_driver": node.extension_driver,
        "fabric_manager": node.fabric_manager,
        "cuda_packages": list(node.cuda_packages),
        "cudnn_packages": list(node.cudnn_packages),
        "repo_arch": node.repo_arch,
        "image_name": node.image.name if node.image else "default",
    }


def container_config(spec: JobSpec, node: NodeStack | None = None, owned_host: bool = False) -> dict[str, object]:
    """The agent's `container` document ({} when the job runs on the machine itself). No password:
    the pull login (container.login's, or a registry token the CLI asks for) reaches the node sealed
    with the secrets (run/pull_login.py); `sealed_login` says the node waits for one.
    `prepulled`: the machine boots an image baked for this container (its stack hash names the
    image), so the node uses the image it holds; `pull_only`: the image builder, which pulls the
    image into the disk it snapshots and runs its own marker on the machine. `pull`: container.pull,
    else `missing` on a host the user owns (its images are the user's) and `always` on a fresh machine."""
    box = spec.container
    if box is None:
        return {}
    ref = box.ref
    doc: dict[str, object] = {
        "image": str(ref),
        "options": list(box.options),
        "user": box.user or "",
        "entrypoint": box.entrypoint or "",
        "sealed_login": box.login is not None or _token_registry(ref.registry, ref.repository),
        "prepulled": bool(node is not None and node.image is not None and node.image.found_by == "baked"),
        "pull_only": spec.run == BUILDER_RUN,
        "pull": box.pull or ("missing" if owned_host else "always"),
    }
    if node is not None and node.container_bytes > 0:  # the pull's deadline scales with it (vm/agent/container.py)
        doc["size_bytes"] = node.container_bytes
    if box.login is not None:
        doc["login"] = {
            "registry": box.registry,
            "username": box.login.username,
            "password_secret": box.login.password_secret,
        }
    return doc


def _token_registry(registry: str, repository: str) -> bool:
    """A registry whose pull token the CLI gets with the caller's credentials (as pull_login.py):
    a provider's container registry, found through the registry of providers."""
    from gpucloud.contract import registry as providers

    return providers.image_login(registry, repository, None, None) is not None
