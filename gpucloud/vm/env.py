"""The environment names the VM side keeps for itself: a job's `env` cannot set them.

The job file's `env` is checked against this table when it is loaded (a job setting JOB or SETSID
would break its own start), so this sits below the spec. The node's names are a plain table: the
shim and the agent's job wrapper use them, and a job that set one would change how its own node
runs it; the names a job may set on purpose (NODE_RANK, MASTER_ADDR, MASTER_PORT) are not in it.
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
# Names the node's own shell code keeps for itself (deadline, channel URLs, stages, stack, job start).
NODE_RESERVED = frozenset(
    {
        "APT_FRESH",
        "ARTIFACTS",
        "ART_PUT",
        "BACKSTOP_PID",
        "BAD_W",
        "BARRIER_S",
        "CB",
        "CKPT",
        "CKPT_GET",
        "CKPT_PUT",
        "CKPT_S",
        "CKPT_SUM_GET",
        "CKPT_SUM_PUT",
        "CLAIM_APP",
        "CLAIM_SIGN",
        "CODE_GET",
        "CUDA",
        "CUDA_PKGS",
        "CUDA_REPO",
        "CUDNN_PKGS",
        "DEADLINE",
        "DEBIAN_FRONTEND",
        "DL",
        "DONE_GET",
        "DONE_PUT",
        "DRIVER",
        "DRV_LOCK",
        "DRV_MAX",
        "DRV_MIN",
        "DRV_PKGS",
        "FW",
        "FW_PIP",
        "FW_VER",
        "GPU_CHECK",
        "GPU_MODEL",
        "GPU_TOKENS",
        "GRACE",
        "GRACE_S",
        "GRID_WAIT_S",
        "GUARD_PID",
        "HB_MS",
        "HOLD",
        "IFS",
        "JOB",
        "LOG",
        "LOG_APP",
        "LOG_DIR",
        "LOG_F",
        "LOG_KEY",
        "LOG_MAX",
        "LOG_MS",
        "LOG_N",
        "LOG_POST",
        "MANIFEST_URL",
        "MAX_DURATION",
        "NGPU",
        "NODES",
        "NODE_IPS",
        "NOTICE_GET",
        "NOTICE_MS",
        "NOTICE_WHY",
        "NV_REPO",
        "PIP_BREAK_SYSTEM_PACKAGES",
        "PUMP_PID",
        "PUT_H",
        "RANK",
        "READY_GET",
        "READY_PUT",
        "REPO_ARCH",
        "RESUMED",
        "RUN_CMD",
        "RUN_ID",
        "SELF",
        "SETSID",
        "SETUP_CMD",
        "ST",
        "STAGES",
        "STATUS_PUT",
        "T0",
        "TICK",
        "W",
        "WD_PID",
    }
)
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
