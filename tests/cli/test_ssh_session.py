"""`gpucloud ssh` on the local provider, through the real CLI: a command in the node's folder and
environment (the stub nvidia-smi the node sees), its exit code, a forwarded port that serves a page
from the node, and the errors for a run that is not running, a node that does not exist and a
forward that would listen beyond loopback."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.support.cli import REPO, cli
from tests.support.local_runs import write_job
from tests.support.polling import wait_until
from tests.support.sessions import hold_forwards, page
from tests.support.sshd import free_port
from tests.support.text import flat

SMI = '#!/bin/sh\nfor i in 0 1; do echo "GPU $i: Tesla T4 (UUID: GPU-stub-$i)"; done\n'


@pytest.fixture
def env(tmp_path: Path, gpucloud_home: Path) -> dict[str, str]:
    """The CLI's environment: a stub nvidia-smi (two T4s) first on PATH, which the node inherits."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "GPUCLOUD_HOME": str(gpucloud_home),
        "PYTHONPATH": str(REPO),
        "HOME": str(tmp_path / "home"),
    }


def start(tmp_path: Path, env: dict[str, str], run: str, **doc: object) -> str:
    """`run --detach` of a job on the local provider; the run id once its job is running."""
    spec = write_job(tmp_path / "job", {"name": "sess", "run": run, **doc}, {"index.html": "page from the node\n"})
    proc = cli("run", str(spec), "--detach", "--yes", env=env, cwd=tmp_path / "job", timeout=60)
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.strip().splitlines()[-1]
    node = Path(env["GPUCLOUD_HOME"]) / "local" / run_id / "node-0"
    assert wait_until(lambda: (node / "job.pgid").is_file(), 30), (node / "console.log").read_text()
    return run_id


def test_command_runs_on_the_node_and_prints_its_gpus(tmp_path: Path, env: dict[str, str]) -> None:
    run_id = start(tmp_path, env, "sleep 120")
    try:
        t0 = time.monotonic()
        smi = cli("ssh", run_id, "--", "nvidia-smi", "-L", env=env, cwd=tmp_path)
        took = time.monotonic() - t0
        assert smi.returncode == 0, smi.stderr
        gpus = ["GPU 0: Tesla T4 (UUID: GPU-stub-0)", "GPU 1: Tesla T4 (UUID: GPU-stub-1)"]
        assert smi.stdout.splitlines() == gpus, smi.stdout
        print(f"ssh RUN -- nvidia-smi -L on the local provider: {took:.2f}s")
        where = cli("ssh", run_id, "--", "pwd;", "ls", env=env, cwd=tmp_path)
        home = Path(env["GPUCLOUD_HOME"]).resolve()
        assert where.stdout.splitlines()[0] == str(home / "local" / run_id / "node-0" / "job")
        assert "index.html" in where.stdout.splitlines()
        assert cli("ssh", run_id, "--", "exit", "7", env=env).returncode == 7  # the command's own code
    finally:
        cli("down", run_id, "--yes", env=env)


def test_forwarded_port_serves_a_page_from_the_node(tmp_path: Path, env: dict[str, str]) -> None:
    port = free_port()
    run_id = start(tmp_path, env, f"python3 -m http.server {port} --bind 127.0.0.1", ports=[port])
    proc, found = hold_forwards(env, run_id)
    try:
        assert int(found.group(1)) == port and found.group(4) == "the node's own port on this machine", found
        assert wait_until(lambda: page(found.group(2) + "index.html") == "page from the node\n", 20)
    finally:
        proc.terminate()
        assert proc.wait(10) == 143  # TERM ends the session (and what it holds) with it
        cli("down", run_id, "--yes", env=env)


def test_errors_name_the_run_the_node_and_the_fix(tmp_path: Path, env: dict[str, str]) -> None:
    unknown = cli("ssh", "nosuch-run", "--", "true", env=env)
    assert unknown.returncode == 2 and "no run 'nosuch-run'" in unknown.stderr
    run_id = start(tmp_path, env, "sleep 120")
    try:
        node = cli("ssh", run_id, "--node", "3", "--", "true", env=env)
        assert node.returncode == 2 and "has node(s) 0..0" in flat(node.stderr), node.stderr
        wide = cli("ssh", run_id, "-L", "0.0.0.0:8888:8888", "--", "true", env=env)
        assert wide.returncode == 2 and "127.0.0.1 only" in flat(wide.stderr), wide.stderr
        entry = cli("ssh", run_id, "--print-config", env=env)
        assert entry.returncode == 2 and "not reached by ssh" in flat(entry.stderr), entry.stderr
        assert "Traceback" not in node.stderr + wide.stderr + entry.stderr
    finally:
        cli("down", run_id, "--yes", env=env)
    ended = cli("ssh", run_id, "--", "true", env=env)
    assert ended.returncode == 2 and f"run {run_id} is down" in flat(ended.stderr), ended.stderr


def test_dev_keeps_a_machine_with_the_jobs_workdir_or_says_what_it_needs(tmp_path: Path, env: dict[str, str]) -> None:
    spec = write_job(tmp_path / "job", {"name": "devbox", "run": "python train.py"}, {"train.py": "print(1)\n"})
    dev = cli("dev", str(spec), "--idle", "2m", "--yes", env=env, cwd=tmp_path / "job", timeout=120)
    assert dev.returncode == 0, dev.stderr
    run_id = dev.stdout.strip().splitlines()[-1]
    try:
        assert "the node is this machine" in flat(dev.stderr) and f"gpucloud ssh {run_id}" in flat(dev.stderr)
        files = cli("ssh", run_id, "--", "ls", env=env)
        assert files.returncode == 0 and "train.py" in files.stdout.split(), files.stdout + files.stderr
    finally:
        cli("down", run_id, "--yes", env=env)
