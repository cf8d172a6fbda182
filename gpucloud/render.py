"""Render the VM bootstrap (user-data) from the job, its resolved stack and the chosen candidate.

The script is the only thing a VM receives, so it must be exact: Jinja2 with StrictUndefined (a
missing value is a bug, never an empty string), no HTML autoescaping, and every value that came
from the job file passed through `shlex.quote` so that bash reads it once, literally, and nothing
in it is evaluated twice. Clouds cap user-data (each provider declares `user_data_limit` and
`user_data_encoding` in its Capabilities, docs/PROVIDERS.md "User data"): the provider contract
(gpucloud/providers/base.py) measures, checks and gzips it (cloud-init unpacks gzip'd user-data).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from functools import cache
from typing import TYPE_CHECKING

import jinja2

from gpucloud.channel import LOG_PART_MAX
from gpucloud.errors import UserError
from gpucloud.providers.base import DEFAULT_MASTER_PORT, Capabilities
from gpucloud.vm_env import TEMPLATE, load_template_source, reserved_env_names

if TYPE_CHECKING:
    from gpucloud.images import NodeStack
    from gpucloud.providers.base import Candidate
    from gpucloud.spec import JobSpec
    from gpucloud.stacks import Stack

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@cache
def template_env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(load_template_source),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        # bash uses "{#" in ${#array[@]}: Jinja comments are {## ... ##} instead.
        comment_start_string="{##",
        comment_end_string="##}",
    )
    env.filters["q"] = quote
    return env


def quote(value: object) -> str:
    """shlex.quote, always in quotes (shellcheck reads a bare `r-12` as arithmetic)."""
    q = shlex.quote(str(value))
    return q if q.startswith("'") else f"'{q}'"


def gpu_tokens(model: str) -> list[str]:
    """Tokens that must all appear (as whole words) in nvidia-smi's name for the catalog model:
    "A100-80GB" -> ["A100", "80GB"] matches "NVIDIA A100-SXM4-80GB"; "A10" does not match "A10G"."""
    return [t for t in re.split(r"[^A-Z0-9]+", model.upper()) if t]


def render_env_block(env: Mapping[str, str], indent: str = "  ") -> str:
    """`export KEY='value'` lines, each value shlex-quoted so bash takes it byte for byte."""
    lines = []
    for key, value in env.items():
        if not _ENV_KEY.match(key):
            raise UserError(
                f"env: {key!r} is not a valid variable name.", hint="Use letters, digits and _ (not first)."
            )
        if key in reserved_env_names() or key.startswith("BASH"):
            raise UserError(
                f"env: {key} is a variable that bash or the VM bootstrap owns; it cannot be set for the job.",
                hint="Choose another name.",
            )
        value = str(value)
        if "\0" in value:
            raise UserError(f"env.{key}: a NUL character cannot be passed through the environment.")
        lines.append(f"{indent}export {key}={quote(value)}")
    return "\n".join(lines)


def render_bootstrap(
    spec: JobSpec,
    stack: Stack,
    candidate: Candidate,
    *,
    caps: Capabilities,
    run_id: str,
    node_rank: int | None = 0,
    manifest_url: str = "",
    put_headers: Sequence[str] = (),
    log_interval: float | None = None,
    heartbeat_interval: float | None = None,
    master_port: int = DEFAULT_MASTER_PORT,
    barrier_timeout: float | None = None,
    node: NodeStack | None = None,
) -> str:
    """The bootstrap script of one node (docs/INTERNALS.md, "Renderer").

    `caps` (the provider's declared Capabilities) decides everything provider-specific: whether the
    stack is installed, how strict the GPU check is, the work folder, whether nodes share one
    address (publish 127.0.0.1), how the VM ends itself, and the default log/heartbeat/barrier times.
    node_rank=None renders one script for every node (a provider with shared_user_data that launches
    N identical machines in one call): the node takes its rank from GPUCLOUD_NODE_RANK or the
    instance's launch index, and `manifest_url` must be the run's node index (`Channel.node_index`).
    master_port: MASTER_PORT of the job (`Provider.master_port()`). barrier_timeout: seconds a node
    of a multi-node run waits for its peers' `ready` before it fails in state `error`.
    """
    if not _RUN_ID.match(run_id):
        raise ValueError(f"run id {run_id!r} must match {_RUN_ID.pattern}")
    if node_rank is not None and not 0 <= node_rank < spec.num_nodes:
        raise ValueError(f"node_rank {node_rank} outside 0..{spec.num_nodes - 1}")
    log_interval, heartbeat_interval, barrier_timeout = _timings(
        caps, log_interval, heartbeat_interval, barrier_timeout, master_port
    )
    node = node or _node_stack(spec, stack, candidate)  # issue 13
    gpu_model = candidate.gpu or ""
    gpu_count = candidate.gpu_count if gpu_model else 0
    framework = stack.framework if stack.framework in ("pytorch", "tensorflow") else "none"
    tick = max(0.05, min(log_interval, heartbeat_interval, 1.0))
    context = {
        "self_termination": caps.self_termination,
        "run_id": run_id,
        "node_rank": 0 if node_rank is None else int(node_rank),
        "shared": node_rank is None,
        "num_nodes": int(spec.num_nodes),
        "master_port": int(master_port),
        "barrier_s": max(1, math.ceil(barrier_timeout)),
        "gpu_count": int(gpu_count),
        "gpu_model": gpu_model,
        "gpu_tokens": gpu_tokens(gpu_model),
        "gpu_check": caps.gpu_check,
        "manifest_url": manifest_url,
        "put_headers": list(put_headers),
        "log_ms": int(log_interval * 1000),
        "log_part_max": LOG_PART_MAX,
        "hb_ms": int(heartbeat_interval * 1000),
        "tick": f"{tick:.2f}".rstrip("0").rstrip("."),
        "max_duration": int(spec.max_duration),
        "stack": stack,
        **stack_context(node),
        "framework": framework,
        "framework_version": stack.framework_version or "",
        "framework_pip": list(stack.framework_pip) if framework != "none" else [],
        "setup": spec.setup or "",
        "run": spec.run,
        "artifacts": list(spec.artifacts),
        "env_block": render_env_block(spec.env),
        "default_dir": caps.vm_dir,
        "skip_stack": not caps.install_stack,
        "node_ips_known": caps.node_ips_known,
        **_spot_context(spec, caps, heartbeat_interval),
        **_gpu_usage_context(spec, gpu_count),
    }
    return template_env().get_template(TEMPLATE).render(**context)


GPU_SAMPLE_ENV = "GPUCLOUD_GPU_SAMPLE_S"  # seconds between GPU samples (the simulators shorten it)
DEFAULT_GPU_SAMPLE_S = 5.0


def gpu_sampling(spec: JobSpec, gpu_count: int) -> tuple[float, int]:
    """How often the node samples its GPUs (0: no GPU, no sampler) and the job's idle timeout."""
    import os

    if not gpu_count:
        return 0.0, 0
    try:
        every = float(os.environ.get(GPU_SAMPLE_ENV) or DEFAULT_GPU_SAMPLE_S)
    except ValueError:
        every = DEFAULT_GPU_SAMPLE_S
    return max(every, 0.2), int(spec.resources.idle_timeout or 0)


def _gpu_usage_context(spec: JobSpec, gpu_count: int) -> dict[str, object]:
    """The node's GPU sampler (gpucloud/vm/agent/gpu_usage.py, shipped in the script: the bash
    bootstrap has no other way to carry it), how often it samples, and the idle timeout."""
    from pathlib import Path

    every, idle = gpu_sampling(spec, gpu_count)
    if not every:
        return {"gpu_usage_py": "", "gpu_sample_s": 0, "idle_timeout": 0}
    from gpucloud.vm.agent import gpu_usage

    return {
        "gpu_usage_py": _compact(Path(gpu_usage.__file__).read_text(encoding="utf-8")),
        "gpu_sample_s": f"{every:g}",
        "idle_timeout": idle,
    }


def _compact(source: str) -> str:
    """A module's code without comments and docstrings (the user-data has a size limit). The main
    docstring is kept as one line: argparse's description reads it."""
    import ast

    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            doc = body[0].value
            if isinstance(doc, ast.Constant) and isinstance(doc.value, str):
                if node is tree:
                    doc.value = doc.value.splitlines()[0]
                elif len(body) > 1:
                    del body[0]
    return ast.unparse(tree)


def _spot_context(spec: JobSpec, caps: Capabilities, heartbeat_interval: float) -> dict[str, object]:
    """The guard's settings (docs/SPOT.md): the cloud's notice source, how often it looks, the
    job's grace after SIGTERM, and the checkpoint folder and interval."""
    return {
        "preemption_notice": caps.preemption_notice or "",
        "notice_ms": int(min(5.0, heartbeat_interval / 2) * 1000),
        "preempt_grace": max(1, math.ceil(caps.preemption_grace)),
        "checkpoint": spec.checkpoint or "",
        "checkpoint_interval": int(spec.checkpoint_interval),
    }


def _timings(
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


def _node_stack(spec: JobSpec, stack: Stack, candidate: Candidate) -> NodeStack:
    """Image + install plan of this VM (gpucloud/images.py, issue 13)."""
    from gpucloud.images import cpu_arch_of, resolve_node

    return resolve_node(
        stack,
        candidate.cloud,
        candidate.instance_type,
        candidate.gpu_count,
        cpu_arch=cpu_arch_of(candidate),
        job_image=spec.image,
        chosen=candidate.image,
    )


def stack_context(node: NodeStack) -> dict[str, object]:
    """The template values of the stack stage (issue 13): what to check, and what to install if missing."""
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
