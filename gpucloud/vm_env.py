"""The environment names the VM's bootstrap keeps for itself, read from the bootstrap template.

The job file's `env` is checked against them when it is loaded (a job setting JOB or SETSID would
break its own start), so this sits below the spec; the renderer loads the template through here too.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from pathlib import Path

TEMPLATE = "bootstrap.sh.j2"
# Names bash owns (read-only, or reset by bash itself): a job cannot set them through its env.
BASH_RESERVED = frozenset(
    {
        "_",
        "UID",
        "EUID",
        "PPID",
        "SHELLOPTS",
        "BASHOPTS",
        "BASHPID",
        "RANDOM",
        "SRANDOM",
        "SECONDS",
        "LINENO",
        "EPOCHSECONDS",
        "EPOCHREALTIME",
        "FUNCNAME",
        "GROUPS",
        "HISTCMD",
        "DIRSTACK",
        "PIPESTATUS",
    }
)
_REPO_TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def load_template_source(name: str) -> str:
    """Templates ship in the wheel as package `gpucloud.templates`; a source checkout has them in
    the top-level templates/ folder (not a package there), hence the fallback."""
    try:
        return resources.files("gpucloud.templates").joinpath(name).read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError, TypeError):
        return (_REPO_TEMPLATES / name).read_text(encoding="utf-8")


_ASSIGNED = re.compile(r"(?:^|[\s;({])([A-Z_][A-Z0-9_]*)(?:\[[^]]*\])?\+?=|\bread -r[a]? ([A-Z_][A-Z0-9_]*)")
_JOB_EXPORTS = re.compile(r"^job_env\(\) \{\n(.*?)^\}", re.S | re.M)


@cache
def reserved_env_names() -> frozenset[str]:
    """Names a job's `env` must not set: bash's own, and every upper-case variable the bootstrap
    template assigns (read from the template itself, so the list never drifts from it), except
    those the bootstrap exports to the job on purpose (NODE_RANK, MASTER_ADDR, MASTER_PORT: a job
    may override them). A job setting JOB or SETSID would otherwise break its own start."""
    text = re.sub(r"\{##.*?##\}", "", load_template_source(TEMPLATE), flags=re.S)
    assigned = {a or b for a, b in _ASSIGNED.findall(text)}
    exports = _JOB_EXPORTS.search(text)
    exported = {
        name
        for line in (exports.group(1) if exports else "").splitlines()
        if "export " in line
        for name in re.findall(r"(?<=\s)([A-Z_][A-Z0-9_]*)(?=[=\s;]|$)", f" {line.split('export ', 1)[1]} ")
    }
    return frozenset((assigned - exported) | BASH_RESERVED)
