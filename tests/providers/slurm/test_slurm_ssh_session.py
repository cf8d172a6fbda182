"""`gpucloud ssh` on Slurm, against the real cluster and OpenSSH login node of tests/support/: a
command runs as an overlapping step of the run's own job on its node, in the node's folder (the
stub nvidia-smi the nodes see), a forwarded port reaches the node through the login node, and the
`gpucloud-RUN` entry opens the same step with plain ssh."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.cli import cli
from tests.support.polling import wait_until
from tests.support.sessions import hold_forwards, page
from tests.support.slurm_cluster import (
    have_slurm,
    missing,
    queue_empty_after,  # noqa: F401  (autouse: the queue is empty after each test)
)
from tests.support.slurm_runs import cli_env, cluster, job, login  # noqa: F401  (fixtures)
from tests.support.sshd import SshdServer, SshLab, free_port, have_sshd
from tests.support.text import flat

pytestmark = [
    pytest.mark.skipif(not have_sshd(), reason="needs /usr/sbin/sshd and ssh (openssh-server)"),
    pytest.mark.skipif(not have_slurm(), reason=f"needs Slurm and munge: {missing()}"),
]


def start(cli_env: dict[str, str], spec: Path, server: SshdServer) -> tuple[str, Path]:
    """`run --detach` on the cluster: the run id and node 0's folder once its job runs."""
    proc = cli("run", str(spec), "--detach", "--yes", cwd=spec.parent, env=cli_env, timeout=180)
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.strip().splitlines()[-1]
    node = server.remote_root / "work" / run_id / "node-0"
    assert wait_until(lambda: (node / "job.pgid").is_file(), 90), run_id
    return run_id, node


def test_command_runs_in_the_jobs_allocation_on_its_node(
    login: tuple[SshLab, SshdServer], cli_env: dict[str, str], tmp_path: Path
) -> None:
    lab, server = login
    run_id, node = start(cli_env, job(tmp_path, "sess", "run: sleep 300\n"), server)
    try:
        t0 = time.monotonic()
        smi = cli("ssh", run_id, "--", "nvidia-smi", "-L", env=cli_env, timeout=60)
        took = time.monotonic() - t0
        assert smi.returncode == 0, smi.stderr
        assert smi.stdout.startswith("GPU 0: Tesla K80"), smi.stdout
        print(f"ssh RUN -- nvidia-smi -L on Slurm (login node, srun --overlap): {took:.2f}s")
        here = cli("ssh", run_id, "--", 'echo "$PWD $SLURM_JOB_ID $GPUCLOUD_NODE_RANK"', env=cli_env, timeout=60)
        job_id = (server.remote_root / "work" / run_id / "slurm-job").read_text().strip()
        assert here.stdout.split() == [str(node / "job"), job_id, "0"], here.stdout + here.stderr
        assert cli("ssh", run_id, "--", "exit", "5", env=cli_env, timeout=60).returncode == 5
        entry = cli("ssh", run_id, "--print-config", env=cli_env)
        assert entry.returncode == 0, entry.stderr
        assert f"--jobid={job_id}" in entry.stdout or f"J={job_id};" in entry.stdout
        assert 'srun --jobid="$J" --overlap' in entry.stdout and "-o %%N" in entry.stdout
        config = tmp_path / "ssh_config"
        config.write_text(entry.stdout + f"Include {lab.config}\n")
        env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
        plain = subprocess.run(
            ["ssh", "-F", str(config), "-o", "RequestTTY=no", f"gpucloud-{run_id}"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            input="echo $SLURM_JOB_ID\n",
            check=False,
        )
        assert job_id in plain.stdout, plain.stdout + plain.stderr
    finally:
        cli("down", run_id, "--yes", env=cli_env, timeout=120)
    gone = cli("ssh", run_id, "--", "true", env=cli_env)
    assert gone.returncode == 2 and f"run {run_id} is down" in flat(gone.stderr)


def test_forwarded_port_reaches_the_node_through_the_login_node(
    login: tuple[SshLab, SshdServer], cli_env: dict[str, str], tmp_path: Path
) -> None:
    _, server = login
    port = free_port()
    (tmp_path / "index.html").write_text("page from the slurm node\n")
    body = f"ports: [{port}]\nrun: python3 -m http.server {port} --bind 127.0.0.1\n"
    run_id, _ = start(cli_env, job(tmp_path, "web", body), server)
    proc, found = hold_forwards(cli_env, run_id)
    try:
        assert int(found.group(1)) == port and found.group(4) == "forwarded over the session", found
        assert wait_until(lambda: page(found.group(2) + "index.html") == "page from the slurm node\n", 30)
    finally:
        proc.terminate()
        assert proc.wait(10) == 143
        cli("down", run_id, "--yes", env=cli_env, timeout=120)
