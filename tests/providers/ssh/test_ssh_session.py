"""`gpucloud ssh` to a node on an SSH host, against the real sshd of tests/support/sshd.py: a command
in the node's folder with the GPUs the run holds (the host's stub nvidia-smi), a forwarded port that
serves a page from the node through the printed local URL, and the `gpucloud-RUN` entries that
plain `ssh` and `scp` use through one Include line, removed with the run."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.cli import cli
from tests.support.polling import wait_until
from tests.support.sessions import hold_forwards, page
from tests.support.ssh_runs import cli_env, job, lab, server, start_detached  # noqa: F401  (fixtures)
from tests.support.sshd import SshLab, free_port, have_sshd
from tests.support.text import flat

pytestmark = pytest.mark.skipif(not have_sshd(), reason="needs /usr/sbin/sshd and ssh (openssh-server)")


def test_command_reaches_the_node_and_prints_the_hosts_gpus(
    lab: SshLab, cli_env: dict[str, str], tmp_path: Path
) -> None:
    box = server(lab, "k40box")
    spec = job(tmp_path, "sess", "resources: {cloud: ssh, hosts: k40box, gpu: K40}\nrun: sleep 120\n")
    run_id, node = start_detached(cli_env, spec, tmp_path, box)
    try:
        t0 = time.monotonic()
        smi = cli("ssh", run_id, "--", "nvidia-smi", "-L", env=cli_env)
        took = time.monotonic() - t0
        assert smi.returncode == 0, smi.stderr
        assert smi.stdout.startswith("GPU 0: Tesla K40m"), smi.stdout
        print(f"ssh RUN -- nvidia-smi -L on the SSH provider (real sshd): {took:.2f}s")
        here = cli("ssh", run_id, "--", 'echo "$PWD $CUDA_VISIBLE_DEVICES"', env=cli_env)
        assert here.stdout.split() == [str(node / "job"), "0"], here.stdout + here.stderr
        assert cli("ssh", run_id, "--", "exit", "9", env=cli_env).returncode == 9
        missing = cli("ssh", run_id, "--node", "1", "--", "true", env=cli_env)
        assert missing.returncode == 2 and "has node(s) 0..0" in flat(missing.stderr)
    finally:
        cli("down", run_id, "--yes", env=cli_env)


def test_forwarded_port_serves_a_page_from_the_node(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    box = server(lab, "cpu1")
    port = free_port()
    serve = f"python3 -m http.server {port} --bind 127.0.0.1"
    spec = job(tmp_path, "web", f"resources: {{cloud: ssh, hosts: cpu1}}\nports: [{port}]\nrun: {serve}\n")
    (tmp_path / "index.html").write_text("page from the ssh node\n")
    run_id, _ = start_detached(cli_env, spec, tmp_path, box)
    proc, found = hold_forwards(cli_env, run_id)
    try:
        # Every test host is this machine: the node's port is taken here, so the forward gets another.
        assert int(found.group(1)) == port and int(found.group(3)) != port, found
        assert found.group(4) == "forwarded over the session"
        url = found.group(2) + "index.html"
        t0 = time.monotonic()
        assert wait_until(lambda: page(url) == "page from the ssh node\n", 30)
        print(f"first page through the forward after {time.monotonic() - t0:.2f}s")
    finally:
        proc.terminate()
        assert proc.wait(10) == 143
        cli("down", run_id, "--yes", env=cli_env)
    with pytest.raises(OSError):  # the forward ended with the session
        urllib.request.urlopen(url, timeout=2)


def test_ssh_entries_work_for_ssh_and_scp_and_go_with_the_run(
    lab: SshLab, cli_env: dict[str, str], tmp_path: Path
) -> None:
    box = server(lab, "t4box")
    spec = job(tmp_path, "ent", "resources: {cloud: ssh, hosts: t4box, gpu: T4}\nrun: sleep 120\n")
    (tmp_path / "note.txt").write_text("from the workdir\n")
    run_id, node = start_detached(cli_env, spec, tmp_path, box)
    home = tmp_path / "user-home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text("Host mine\n  HostName example.invalid\n")
    env = {**cli_env, "HOME": str(home)}
    try:
        printed = cli("ssh", run_id, "--print-config", env=env)
        assert printed.returncode == 0, printed.stderr
        assert f"Host gpucloud-{run_id}-0 gpucloud-{run_id}\n" in printed.stdout
        assert "StrictHostKeyChecking yes" in printed.stdout
        assert (home / ".ssh" / "config").read_text() == "Host mine\n  HostName example.invalid\n"  # untouched
        wrote = cli("ssh", run_id, "--write-config", env=env)
        assert wrote.returncode == 0, wrote.stderr
        config = (home / ".ssh" / "config").read_text().splitlines()
        entries = Path(env["GPUCLOUD_HOME"]) / "ssh-config" / f"{run_id}.conf"
        assert config[1] == f"Include {entries.parent}/*.conf" and config[3:] == [
            "Host mine",
            "  HostName example.invalid",
        ]
        assert entries.stat().st_mode & 0o777 == 0o600
        assert cli("ssh", run_id, "--write-config", env=env).returncode == 0
        assert (home / ".ssh" / "config").read_text().count("Include") == 1  # once, however often asked
        plain = ["ssh", "-F", str(home / ".ssh" / "config"), f"gpucloud-{run_id}"]
        smi = subprocess.run([*plain, "nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
        assert smi.returncode == 0 and smi.stdout.startswith("GPU 0: Tesla T4"), smi.stderr
        copy = tmp_path / "copied.txt"
        scp = ["scp", "-O", "-F", str(home / ".ssh" / "config"), f"gpucloud-{run_id}-0:{node}/job/note.txt", str(copy)]
        assert subprocess.run(scp, capture_output=True, timeout=30, check=False).returncode == 0
        assert copy.read_text() == "from the workdir\n"
    finally:
        cli("down", run_id, "--yes", env=env)
    assert not entries.exists()  # the entries name a machine that is gone
