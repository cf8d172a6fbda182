"""A kept machine on Slurm, against the real cluster and OpenSSH login node of tests/support/, through
the real CLI: the job's allocation stays after its job, `run --on` runs the next job in it, and the
allocation ends by the idle time, or by max_duration while kept; each time the run's follower
tears down what is left and nothing stays in squeue (the autouse fixture checks the queue)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucloud.run import keep
from tests.support.cli import cli
from tests.support.local_runs import run_id_of
from tests.support.polling import wait_until
from tests.support.slurm_cluster import (
    SlurmCluster,
    have_slurm,
    missing,
    queue_empty_after,  # noqa: F401  (autouse: the queue is empty after each test)
)
from tests.support.slurm_runs import cli_env, cluster, job, login  # noqa: F401  (fixtures)
from tests.support.sshd import SshdServer, SshLab, have_sshd

pytestmark = [
    pytest.mark.skipif(not have_sshd(), reason="needs /usr/sbin/sshd and ssh (openssh-server)"),
    pytest.mark.skipif(not have_slurm(), reason=f"needs Slurm and munge: {missing()}"),
]


def _status(env: dict[str, str], run_id: str) -> dict:
    return json.loads(cli("status", run_id, "--json", env=env, check=True).stdout)


def _kept(env: dict[str, str], spec: Path) -> str:
    proc = cli("run", str(spec), "--yes", cwd=spec.parent, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "the machine is kept for" in proc.stderr
    return run_id_of(proc.stderr)


def _ended(env: dict[str, str], cluster: SlurmCluster, run_id: str) -> dict:
    """Once the allocation is gone from squeue and the follower tore the run down: its status."""
    assert wait_until(lambda: not cluster.squeue(), timeout=90), cluster.squeue()
    assert wait_until(lambda: keep.follower_pid(run_id) is None, timeout=30)
    doc = _status(env, run_id)
    assert all(r["status"] == "deleted" for r in doc["resources"]), doc
    return doc


def test_keep_and_run_on_then_the_allocation_ends_idle(
    login: tuple[SshLab, SshdServer], cli_env: dict[str, str], cluster: SlurmCluster, tmp_path: Path
) -> None:
    run_id = _kept(cli_env, job(tmp_path, "keptslurm", "keep: 10s\nrun: echo first\n"))
    (slurm_job,) = cluster.squeue()
    spec = job(tmp_path, "keptslurm", 'keep: 10s\nrun: echo "second-job in $SLURM_JOB_ID"\n')
    proc = cli("run", "--on", run_id, str(spec), cwd=tmp_path, env=cli_env, timeout=90)
    assert proc.returncode == 0, proc.stderr
    job_id = slurm_job.split()[0]
    assert f"second-job in {job_id}" in proc.stdout, (proc.stdout, slurm_job)  # the same allocation
    doc = _ended(cli_env, cluster, run_id)
    assert doc["status"] == "succeeded", doc
    assert "the kept machine was idle for 10s: it ends" in cli("logs", run_id, env=cli_env, check=True).stdout


def test_a_kept_allocation_ends_by_max_duration(
    login: tuple[SshLab, SshdServer], cli_env: dict[str, str], cluster: SlurmCluster, tmp_path: Path
) -> None:
    run_id = _kept(cli_env, job(tmp_path, "keptlife", "keep: 10m\nmax_duration: 20s\nrun: 'true'\n"))
    doc = _ended(cli_env, cluster, run_id)
    assert doc["status"] == "deadline", doc
