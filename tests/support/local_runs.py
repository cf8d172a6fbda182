"""Runs on the local provider through the real CLI: a job folder, the run id a run prints, what of a
run is still alive, and its status document."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from gpucloud.providers.local import engine as vm_engine
from tests.support.cli import cli


def write_job(folder: Path, doc: dict, files: dict[str, str] | None = None) -> Path:
    """folder/job.yaml for the local cloud (10 minutes unless `doc` says), with `files` beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"resources": {"cloud": "local"}, "max_duration": "10m", **doc}
    for name, text in (files or {}).items():
        (folder / name).write_text(text)
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return path


def run_id_of(stderr: str) -> str:
    """The run id from the CLI's "[gpucloud] run ID" line."""
    for line in stderr.splitlines():
        if "] run " in line:
            return line.split("] run ", 1)[1].split()[0]
    raise AssertionError(f"no run id in:\n{stderr}")


def find_vms(root: Path) -> list[vm_engine.BootedVm]:
    """Every VM recorded under `root` (any depth), e.g. all nodes of all local runs."""
    found = [vm_engine.BootedVm.load(pid.parent) for pid in sorted(Path(root).rglob(vm_engine.PID_FILE))]
    return [vm for vm in found if vm is not None]


def leftovers(home: Path, run_id: str, token: str | None = None) -> list[str]:
    """Processes of a run still alive: by the sandbox marker, the pid files, and a command-line token."""
    found = []
    for vm in find_vms(home / "local" / run_id):
        found += [f"{vm.sandbox.name}: pid {p}" for p in vm.leftovers()]
    if token:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    cmd = (entry / "cmdline").read_bytes()
                    state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
                except OSError:
                    continue
                if token.encode() in cmd and state not in ("Z", "X"):
                    found.append(f"pid {entry.name}: {cmd!r}")
    return found


def status_json(run_id: str, cwd: Path) -> dict:
    """`gpucloud status RUN --json`, which must succeed."""
    proc = cli("status", run_id, "--json", cwd=cwd, check=True)
    return json.loads(proc.stdout)
