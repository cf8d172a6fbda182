"""Render the VM bootstrap (user-data) from the job, its resolved stack and the chosen candidate.

The script is the only thing a VM receives, so it must be exact: Jinja2 with StrictUndefined (a
missing value is a bug, never an empty string), no HTML autoescaping, and every value that came
from the job file passed through `shlex.quote` so that bash reads it once, literally, and nothing
in it is evaluated twice. Clouds cap user-data (AWS 16 KB raw, Azure 64 KB base64): helpers here
measure, check and gzip it (cloud-init unpacks gzip'd user-data).
"""

from __future__ import annotations

import base64
import gzip
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2

from gpucloud.errors import UserError

if TYPE_CHECKING:
    from gpucloud.planner import Candidate
    from gpucloud.spec import JobSpec
    from gpucloud.stacks import Stack

TEMPLATE = "bootstrap.sh.j2"
PROVIDERS = ("local", "aws", "azure", "ssh")
AWS_USER_DATA_LIMIT = 16 * 1024        # bytes, before base64 (FACTS.md section 6)
AZURE_CUSTOM_DATA_LIMIT = 64 * 1024    # bytes, after base64
DEFAULT_HEARTBEAT_S = 15.0
DEFAULT_MASTER_PORT = 29500            # torchrun's default; a cloud VM has its address to itself
# How long a node waits at the multi-node barrier for its peers. Generous on clouds: peers install
# their stacks at different speeds; a peer that died is noticed sooner by the CLI (heartbeats).
DEFAULT_BARRIER_TIMEOUT_S = 1200.0
CLOUD_VM_DIR = "/var/lib/gpucloud"     # where a cloud VM keeps the job; GPUCLOUD_VM_DIR overrides
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names bash owns (read-only, or reset by bash itself): a job cannot set them through its env.
BASH_RESERVED = frozenset({
    "_", "UID", "EUID", "PPID", "SHELLOPTS", "BASHOPTS", "BASHPID", "RANDOM", "SRANDOM", "SECONDS",
    "LINENO", "EPOCHSECONDS", "EPOCHREALTIME", "FUNCNAME", "GROUPS", "HISTCMD", "DIRSTACK", "PIPESTATUS",
})
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_REPO_TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def _load_template_source(name: str) -> str:
    """Templates ship in the wheel as package `gpucloud.templates`; a source checkout has them in
    the top-level templates/ folder (not a package there), hence the fallback."""
    try:
        return resources.files("gpucloud.templates").joinpath(name).read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError, TypeError):
        return (_REPO_TEMPLATES / name).read_text(encoding="utf-8")


@cache
def template_env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_load_template_source),
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


def default_log_interval(provider: str) -> float:
    """Seconds between log parts: 1 s on this machine (parts are free, latency matters), 5 s on a
    cloud (each part is one PUT request). Pass the same value to `Channel.prepare`."""
    return 1.0 if provider == "local" else 5.0


def gpu_tokens(model: str) -> list[str]:
    """Tokens that must all appear (as whole words) in nvidia-smi's name for the catalog model:
    "A100-80GB" -> ["A100", "80GB"] matches "NVIDIA A100-SXM4-80GB"; "A10" does not match "A10G"."""
    return [t for t in re.split(r"[^A-Z0-9]+", model.upper()) if t]


def render_env_block(env: Mapping[str, str], indent: str = "  ") -> str:
    """`export KEY='value'` lines, each value shlex-quoted so bash takes it byte for byte."""
    lines = []
    for key, value in env.items():
        if not _ENV_KEY.match(key):
            raise UserError(f"env: {key!r} is not a valid variable name.", hint="Use letters, digits and _ (not first).")
        if key in BASH_RESERVED or key.startswith("BASH"):
            raise UserError(f"env: {key} is a variable that bash itself owns; it cannot be set for the job.",
                            hint="Choose another name.")
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
    provider: str,
    run_id: str,
    node_rank: int | None = 0,
    manifest_url: str = "",
    put_headers: Sequence[str] = (),
    node_ips_known: bool = False,
    log_interval: float | None = None,
    heartbeat_interval: float = DEFAULT_HEARTBEAT_S,
    skip_stack: bool | None = None,
    gpu_check: str | None = None,
    master_port: int = DEFAULT_MASTER_PORT,
    barrier_timeout: float = DEFAULT_BARRIER_TIMEOUT_S,
) -> str:
    """The bootstrap script of one node (docs/INTERNALS.md, "Renderer").

    skip_stack: default True only for `local` (the host's driver is used as it is).
    gpu_check: "strict" (GPU mismatch fails the run; clouds' default) or "warn" (local default:
    no GPU on the host means a warning and a CPU run). node_ips_known: all nodes share this host
    (local provider): each node publishes 127.0.0.1 instead of its private IP.
    node_rank=None renders one script for every node (a provider that launches N identical
    machines in one call, AWS MinCount=MaxCount=N): the node takes its rank from GPUCLOUD_NODE_RANK
    or, on AWS, the instance's launch index, and `manifest_url` must be the run's node index
    (`Channel.node_index`) instead of one node's manifest.
    master_port: MASTER_PORT of the job (29500 on clouds; the local provider picks a free port per
    run, since several runs share loopback). barrier_timeout: seconds a node of a multi-node run
    waits for its peers' `ready` before it fails in state `error` (unused with one node).
    """
    if provider not in PROVIDERS:
        raise ValueError(f"provider must be one of {PROVIDERS}, not {provider!r}")
    if not _RUN_ID.match(run_id):
        raise ValueError(f"run id {run_id!r} must match {_RUN_ID.pattern}")
    if node_rank is not None and not 0 <= node_rank < spec.num_nodes:
        raise ValueError(f"node_rank {node_rank} outside 0..{spec.num_nodes - 1}")
    if log_interval is None:
        log_interval = default_log_interval(provider)
    if log_interval <= 0 or heartbeat_interval <= 0:
        raise ValueError("log_interval and heartbeat_interval must be positive")
    if skip_stack is None:
        skip_stack = provider == "local"
    if gpu_check is None:
        gpu_check = "warn" if provider == "local" else "strict"
    if not 1 <= int(master_port) <= 65535:
        raise ValueError(f"master_port {master_port} outside 1..65535")
    if barrier_timeout <= 0:
        raise ValueError("barrier_timeout must be positive")
    if gpu_check not in ("strict", "warn"):
        raise ValueError(f"gpu_check must be 'strict' or 'warn', not {gpu_check!r}")
    gpu_model = candidate.gpu or ""
    gpu_count = candidate.gpu_count if gpu_model else 0
    framework = stack.framework if stack.framework in ("pytorch", "tensorflow") else "none"
    tick = max(0.05, min(log_interval, heartbeat_interval, 1.0))
    context = {
        "provider": provider,
        "run_id": run_id,
        "node_rank": 0 if node_rank is None else int(node_rank),
        "shared": node_rank is None,
        "num_nodes": int(spec.num_nodes),
        "master_port": int(master_port),
        "barrier_s": max(1, math.ceil(barrier_timeout)),
        "gpu_count": int(gpu_count),
        "gpu_model": gpu_model,
        "gpu_tokens": gpu_tokens(gpu_model),
        "gpu_check": gpu_check,
        "manifest_url": manifest_url,
        "put_headers": list(put_headers),
        "log_ms": int(log_interval * 1000),
        "hb_ms": int(heartbeat_interval * 1000),
        "tick": f"{tick:.2f}".rstrip("0").rstrip("."),
        "max_duration": int(spec.max_duration),
        "stack": stack,
        "apt_packages": [*stack.driver_packages, *stack.cuda_packages, *stack.cudnn_packages],
        "framework": framework,
        "framework_version": stack.framework_version or "",
        "framework_pip": list(stack.framework_pip) if framework != "none" else [],
        "setup": spec.setup or "",
        "run": spec.run,
        "artifacts": list(spec.artifacts),
        "env_block": render_env_block(spec.env),
        "default_dir": "$PWD" if provider == "local" else CLOUD_VM_DIR,
        "skip_stack": bool(skip_stack),
        "node_ips_known": bool(node_ips_known or provider == "local"),
    }
    return template_env().get_template(TEMPLATE).render(**context)


# ---- user-data size ------------------------------------------------------------------------------

def _as_bytes(data: str | bytes) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else data


def user_data_size(data: str | bytes, provider: str) -> int:
    """Bytes as the cloud counts them: AWS the raw bytes, Azure the base64 text."""
    raw = _as_bytes(data)
    if provider == "azure":
        return len(base64.b64encode(raw))
    return len(raw)


def user_data_limit(provider: str) -> int | None:
    return {"aws": AWS_USER_DATA_LIMIT, "azure": AZURE_CUSTOM_DATA_LIMIT}.get(provider)


def check_user_data(data: str | bytes, provider: str) -> int:
    """Raise UserError when the user-data exceeds the provider's limit; return its counted size."""
    size = user_data_size(data, provider)
    limit = user_data_limit(provider)
    if limit is not None and size > limit:
        raise UserError(
            f"The bootstrap for {provider} is {size} bytes, above the {limit}-byte user-data limit.",
            hint="Shorten long `env`, `setup` or `run` values: put them in a script inside `workdir` and call it.",
        )
    return size


def compress_user_data(text: str) -> bytes:
    """gzip'd user-data (cloud-init detects and unpacks it); mtime 0 keeps it reproducible."""
    return gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0)


def fit_user_data(text: str, provider: str) -> bytes:
    """The bytes to send as user-data: as is when they fit, gzip'd when that makes them fit."""
    raw = text.encode("utf-8")
    limit = user_data_limit(provider)
    if limit is None or user_data_size(raw, provider) <= limit:
        return raw
    packed = compress_user_data(text)
    check_user_data(packed, provider)
    return packed
