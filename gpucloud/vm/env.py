"""The environment names the VM side keeps for itself: a job's `env` cannot set them.

The job file's `env` is checked against these tables when it is loaded, so this sits below the spec.
The job runs under `bash -c`, so bash's own names are refused; the node's are the few it sets for
the job that a job overriding them would break (its GPU slice); the names a job may set on purpose
(NODE_RANK, MASTER_ADDR, MASTER_PORT, PYTHONPATH) are not in them.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path

# Names bash owns (read-only, or reset by bash itself): a job cannot set them through its env.
BASH_RESERVED = frozenset(
    {
        "BASHOPTS",
        "BASHPID",
        "DIRSTACK",
        "EPOCHREALTIME",
        "EPOCHSECONDS",
        "EUID",
        "FUNCNAME",
        "GROUPS",
        "HISTCMD",
        "LINENO",
        "PIPESTATUS",
        "PPID",
        "RANDOM",
        "SECONDS",
        "SHELLOPTS",
        "SRANDOM",
        "UID",
        "_",
    }
)
# Names the node sets for the job and a job must not override: the GPUs a run was given on a shared
# machine (an SSH host's locked slice, a Slurm allocation) are CUDA_VISIBLE_DEVICES, and a container
# job's GPUs are the engine's to expose (NVIDIA_VISIBLE_DEVICES). The GPUCLOUD_ prefix is refused by
# the spec as a whole. To use fewer GPUs than the run was given, set the variable inside `run:`.
NODE_RESERVED = frozenset({"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"})
_REPO_TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def load_template_source(name: str) -> str:
    """Templates ship in the wheel as package `gpucloud.templates`; a source checkout has them in
    the top-level templates/ folder (not a package there), hence the fallback."""
    try:
        return resources.files("gpucloud.templates").joinpath(name).read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError, TypeError):
        return (_REPO_TEMPLATES / name).read_text(encoding="utf-8")


@cache
def reserved_env_names() -> frozenset[str]:
    """Names a job's `env` must not set: bash's own and the node's (the tables above)."""
    return NODE_RESERVED | BASH_RESERVED
