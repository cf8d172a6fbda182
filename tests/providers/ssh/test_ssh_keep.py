"""A kept machine on an SSH host, against the real sshd of tests/support/sshd.py, through the real
CLI: the job ends and the host's node stays kept; `run --on` and `exec` run the next jobs there
(changed files only); idle for `keep`, the node ends itself and the run's follower tears down what
is left (the node's folder on the host, the run's processes), without `down` or `gc`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucloud.run import keep
from tests.support.cli import cli
from tests.support.local_runs import run_id_of
from tests.support.polling import wait_until
from tests.support.ssh_runs import cli_env, job, lab, run_processes, server  # noqa: F401  (fixtures)
from tests.support.sshd import SshLab, have_sshd

pytestmark = pytest.mark.skipif(not have_sshd(), reason="needs /usr/sbin/sshd and ssh (openssh-server)")


def _status(env: dict[str, str], run_id: str) -> dict:
    return json.loads(cli("status", run_id, "--json", env=env, check=True).stdout)


def test_keep_run_on_exec_and_idle_end_on_an_ssh_host(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    box = server(lab, "cpu2")
    body = "resources: {cloud: ssh, hosts: cpu2}\nkeep: 12s\nmax_duration: 10m\n"
    (tmp_path / "note.txt").write_text("v1\n")
    proc = cli(
        "run", str(job(tmp_path, "keptssh", body + "run: cat note.txt\n")), cwd=tmp_path, env=cli_env, timeout=180
    )
    assert proc.returncode == 0, proc.stderr
    assert "the machine is kept for 12s" in proc.stderr and "v1" in proc.stderr + proc.stdout
    run_id = run_id_of(proc.stderr)
    node = box.remote_root / "work" / run_id
    assert node.is_dir() and _status(cli_env, run_id)["status"] == "kept"
    (tmp_path / "note.txt").write_text("v2\n")
    spec = job(tmp_path, "keptssh", body + "run: echo second-job; cat note.txt; exit 3\n")
    proc = cli("run", "--on", run_id, str(spec), cwd=tmp_path, env=cli_env, timeout=90)
    assert proc.returncode == 3, proc.stderr
    assert "second-job\nv2\n" in proc.stdout and "2 changed file(s)" in proc.stderr  # note.txt, the job file
    proc = cli("exec", run_id, "--", "echo via-exec", cwd=tmp_path, env=cli_env, timeout=90)
    assert proc.returncode == 0 and "via-exec" in proc.stdout, proc.stderr
    # Idle for 12 s: the node ends itself; its follower removes the node's folder on the host.
    assert wait_until(lambda: not node.exists(), timeout=60), _status(cli_env, run_id)
    assert wait_until(lambda: keep.follower_pid(run_id) is None, timeout=20)
    doc = _status(cli_env, run_id)
    assert doc["status"] == "succeeded" and all(r["status"] == "deleted" for r in doc["resources"]), doc
    assert run_processes(run_id) == []
    assert "the kept machine was idle for 12s: it ends" in cli("logs", run_id, env=cli_env, check=True).stdout
