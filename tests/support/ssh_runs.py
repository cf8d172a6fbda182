"""Runs on the test ssh hosts (tests/support/sshd.py): the lab of hosts the ssh e2e tests share, the
environment a CLI needs to reach them, a job file, and what of a run is still alive on them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import REPO, cli
from tests.support.polling import wait_until
from tests.support.sshd import SshdServer, SshLab

K40 = ("Tesla K40m", 1, 11441, "470.182.03", "11.4")


T4 = ("Tesla T4", 1, 15360, "535.104.05", "12.2")


UBUNTU_2004 = 'ID=ubuntu\nVERSION_ID="20.04"\nPRETTY_NAME="Ubuntu 20.04.6 LTS"\n'  # the same on any test machine


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshLab]:
    """Six hosts: a K40 and a T4 box, two CPU hosts, one with an unknown host key, one bare Ubuntu."""
    lab = SshLab(tmp_path_factory.mktemp("ssh") / "lab")
    lab.add_server("k40box", gpu=K40)
    lab.add_server("t4box", gpu=T4)
    lab.add_server("cpu1")
    lab.add_server("cpu2")
    lab.add_server("stranger", trusted=False)
    lab.add_server("bare", gpu=("Tesla K40m", 1, 11441, "apt", ""), os_release=UBUNTU_2004)
    yield lab
    lab.close()


def server(lab: SshLab, alias: str) -> SshdServer:
    """The lab's host of that alias."""
    return next(s for s in lab.servers if s.alias == alias)


@pytest.fixture
def cli_env(lab: SshLab, gpucloud_home: Path, tmp_path: Path) -> dict[str, str]:
    # lab.env() gives a fresh ControlMaster folder per test: handshakes are counted per test.
    return {**os.environ, **lab.env(), "GPUCLOUD_HOME": str(gpucloud_home), "CI": "true", "PYTHONPATH": str(REPO)}


def job(tmp_path: Path, name: str, body: str) -> Path:
    """tmp_path/NAME.yaml: `name: NAME` and then `body`."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\n{body}")
    return path


def run_processes(run_id: str) -> list[int]:
    """Processes on this machine (every test host is this machine) that belong to the run."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (
                f"GPUCLOUD_RUN_ID={run_id}".encode() in (proc / "environ").read_bytes()
                or run_id.encode() in (proc / "cmdline").read_bytes()
            ):
                found.append(int(proc.name))
        except OSError:
            continue
    return [p for p in found if p != os.getpid()]


def start_detached(env: dict[str, str], spec: Path, cwd: Path, box: SshdServer) -> tuple[str, Path]:
    """`gpucloud run --detach` on one host: (run id, node 0's folder), once the job is running."""
    detached = cli("run", str(spec), "--detach", cwd=cwd, env=env, timeout=180)
    assert detached.returncode == 0, detached.stderr
    run_id = detached.stdout.strip().splitlines()[-1]
    node = box.remote_root / "work" / run_id / "node-0"
    assert wait_until(lambda: (node / "job.pgid").is_file(), 60)
    return run_id, node
