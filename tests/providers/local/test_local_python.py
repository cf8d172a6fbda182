"""A local job runs as on a machine of its own: no gpucloud virtualenv on its PATH and no
VIRTUAL_ENV, and the framework the job asks for is found (a python3 that imports it, said in one
line when it is gpucloud's own) or named as missing in one line before the job starts."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gpucloud.providers.local.interpreter import clean_path, job_python
from tests.support.cli import cli
from tests.support.local_runs import write_job
from tests.support.text import flat

VENV_BIN = str(Path(sys.executable).parent)
IN_VENV = sys.prefix != sys.base_prefix
try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


def venv_env() -> dict[str, str]:
    """The caller's environment with the venv activated (its bin first, VIRTUAL_ENV set)."""
    return {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", "VIRTUAL_ENV": sys.prefix}


def test_clean_path_drops_the_venv_and_keeps_the_rest() -> None:
    env = {"PATH": f"{VENV_BIN}:/opt/tools/bin:/usr/bin", "VIRTUAL_ENV": sys.prefix}
    kept = clean_path(env).split(os.pathsep)
    assert "/opt/tools/bin" in kept and "/usr/bin" in kept
    assert VENV_BIN not in kept


@pytest.mark.skipif(not IN_VENV, reason="gpucloud runs outside a virtualenv here")
def test_a_local_job_sees_no_gpucloud_venv(tmp_path: Path, gpucloud_home: Path) -> None:
    run = 'echo "PATH=$PATH"; echo "VENV=${VIRTUAL_ENV:-none}"; echo "PY=$(command -v python3)"'
    job = write_job(tmp_path / "job", {"name": "clean-env", "run": run})
    proc = cli("run", str(job), "--cloud", "local", cwd=tmp_path, env=venv_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    path = next(line for line in proc.stdout.splitlines() if line.startswith("PATH="))[5:].split(os.pathsep)
    assert VENV_BIN not in path and "VENV=none" in proc.stdout
    python = next(line for line in proc.stdout.splitlines() if line.startswith("PY="))[3:]
    assert not python.startswith((sys.prefix, str(gpucloud_home))), python


@pytest.mark.skipif(not (IN_VENV and HAVE_TORCH), reason="needs torch in gpucloud's own virtualenv")
def test_a_framework_only_the_venv_has_is_used_and_said(tmp_path: Path, gpucloud_home: Path) -> None:
    """framework: pytorch with torch only in gpucloud's venv (as in the test venv): the job gets that
    python, and the plan says so before the job starts; a python3 on the PATH with torch wins."""
    chosen = job_python("pytorch", venv_env())
    run = "python3 -c 'import torch, sys; print(\"torch from\", sys.executable)'"
    job = write_job(tmp_path / "job", {"name": "torch-job", "stack": {"framework": "pytorch"}, "run": run})
    proc = cli("run", str(job), "--cloud", "local", cwd=tmp_path, env=venv_env(), timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "torch from" in proc.stdout
    text = flat(proc.stderr)
    if chosen.python:  # the PATH's python3 lacks torch: gpucloud's own is named, before the job's first stage
        assert f"the job's python and python3 are gpucloud's own {sys.executable}" in text, text
        assert text.index("gpucloud's own") < text.index("stage preflight") if "stage preflight" in text else True
    else:
        assert "stack.framework" not in text


def test_a_framework_nobody_has_is_named_before_the_job(tmp_path: Path, gpucloud_home: Path) -> None:
    job = write_job(tmp_path / "job", {"name": "tf-job", "stack": {"framework": "tensorflow"}, "run": "true"})
    if job_python("tensorflow").python is None and "no python here" not in job_python("tensorflow").note:
        pytest.skip("tensorflow is importable here")
    proc = cli("plan", str(job), "--cloud", "local", cwd=tmp_path, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    text = flat(proc.stderr)
    assert text.count("stack.framework tensorflow") == 1 and "no python here imports tensorflow" in text, text
    assert "python3 -m pip install tensorflow" in text and "set stack.framework: none" in text


def test_the_quickstart_starts_with_its_plan_not_a_warning(tmp_path: Path, gpucloud_home: Path) -> None:
    """The machine's own GPU (or the CPU) is said once, as information, in the plan line."""
    repo = Path(__file__).resolve().parents[3]
    quickstart = str(repo / "examples" / "quickstart.yaml")
    proc = cli("run", quickstart, "--cloud", "local", cwd=tmp_path, env={**os.environ, "COLUMNS": "200"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("plan: local/") and "1 x T4 if the machine has it, else the CPU" in lines[0]
    before_run = lines[: next(i for i, line in enumerate(lines) if "] run " in line)]
    assert not [line for line in before_run if line.startswith("warning:")], before_run
    assert flat(proc.stderr).count("T4 if") == 1
