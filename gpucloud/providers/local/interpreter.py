"""Which python a local job gets. A machine of its own has no gpucloud virtualenv, so the job's PATH
is the caller's without that venv's bin folder (and no VIRTUAL_ENV): what works locally then works
on a machine. A job that asks for a framework (stack.framework) gets the first python3 on that
PATH that imports it, else gpucloud's own interpreter if that one does (said in one line), else a
line naming what is missing, before the job starts: the local provider installs no stack."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# stack.framework -> the module a job imports
FRAMEWORK_MODULES = {"pytorch": "torch", "tensorflow": "tensorflow"}
IMPORT_TIMEOUT_S = 60.0  # importing torch cold takes seconds; a hung import is not a python that has it
FALLBACK_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class JobPython:
    """`python`: the interpreter to put first on the job's PATH (None: the PATH's own python3);
    `note`: the line to show before the job starts ("" when there is nothing to say)."""

    path: str
    python: str | None
    note: str


def venv_bins(environ: Mapping[str, str] | None = None) -> set[str]:
    """The bin folders of the virtualenv gpucloud runs in (and of an activated one)."""
    env = os.environ if environ is None else environ
    bins = {str(Path(env["VIRTUAL_ENV"]) / "bin")} if env.get("VIRTUAL_ENV") else set()
    if sys.prefix != sys.base_prefix:
        bins |= {str(Path(sys.prefix) / "bin"), str(Path(sys.executable).parent)}
    return {os.path.normpath(b) for b in bins}


def clean_path(environ: Mapping[str, str] | None = None) -> str:
    """The caller's PATH without the virtualenv's bin folders."""
    env = os.environ if environ is None else environ
    skip = venv_bins(env)
    kept = [p for p in (env.get("PATH") or FALLBACK_PATH).split(os.pathsep) if p and os.path.normpath(p) not in skip]
    return os.pathsep.join(kept) or FALLBACK_PATH


def _imports(python: str, module: str, path: str) -> bool:
    env = {"PATH": path, "HOME": os.environ.get("HOME", "/"), "LANG": "C.UTF-8"}
    try:
        done = subprocess.run(
            [python, "-c", f"import {module}"], env=env, capture_output=True, timeout=IMPORT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@functools.lru_cache(maxsize=8)
def _job_python(framework: str, path: str) -> JobPython:
    module = FRAMEWORK_MODULES.get(framework)
    if module is None:
        return JobPython(path, None, "")
    on_path = shutil.which("python3", path=path)
    if on_path and _imports(on_path, module, path):
        return JobPython(path, None, "")
    own = sys.executable
    first = f"python3 on the job's PATH ({on_path})" if on_path else "the job's PATH has no python3"
    tried = f"python3 on the job's PATH ({on_path})" if on_path else "a python3 on the job's PATH (none)"
    if _imports(own, module, path):
        return JobPython(
            path,
            own,
            f"local provider: stack.framework {framework}: {first} does not import {module}; the job's python "
            f"and python3 are gpucloud's own {own}, which does.",
        )
    return JobPython(
        path,
        None,
        f"local provider: stack.framework {framework}: no python here imports {module}, neither {tried} nor "
        f"gpucloud's own ({own}), so the job's `import {module}` will fail. Install it for that python3 "
        f"(python3 -m pip install {module}), in setup:, or set stack.framework: none.",
    )


def job_python(framework: str, environ: Mapping[str, str] | None = None) -> JobPython:
    """The job's PATH and interpreter for `framework` (looked up once per CLI process)."""
    return _job_python(framework, clean_path(environ))
