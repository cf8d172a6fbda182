"""inputs: on a machine of the user's own: a local folder of the caller's copied onto the host through
the run's channel (docs/DATA.md), read by the job byte for byte; a mounted S3 folder, and the
teardown that unmounts what a killed node left."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
from pathlib import Path

import pytest

from gpucloud.vm.agent.mounts import mounted_paths
from tests.support.cli import cli
from tests.support.moto_server import Moto, moto, moto_server  # noqa: F401
from tests.support.polling import wait_until
from tests.support.ssh_runs import cli_env, job, lab, run_processes, server, start_detached  # noqa: F401  (fixtures)
from tests.support.sshd import SshLab


def test_local_folder_input_reaches_an_ssh_host(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    data = tmp_path / "local"
    files = {f"d{i % 3}/f{i}.bin": hashlib.sha256(str(i).encode()).digest() * 300 for i in range(12)}
    for rel, body in files.items():
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_bytes(body)
    expect = hashlib.sha256(b"".join(files[k] for k in sorted(files))).hexdigest()
    run = "cat $(find in -type f | sort) | sha256sum"
    spec = job(tmp_path, "sshdata", f"resources: {{cloud: ssh, hosts: [cpu1]}}\ninputs: {{in: ./local}}\nrun: {run}\n")
    res = cli("run", str(spec), cwd=tmp_path, env=cli_env, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert expect in res.stdout + res.stderr
    assert not list((server(lab, "cpu1").remote_root / "work").iterdir()), "teardown removes the work folder"


@pytest.mark.skipif(not (shutil.which("rclone") and shutil.which("fusermount3")), reason="needs rclone and FUSE")
def test_a_mount_left_by_a_killed_node_is_unmounted_by_the_teardown(
    lab: SshLab,  # noqa: F811
    moto: Moto,  # noqa: F811
    cli_env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    """`mode: mount` on an ssh host: the job reads through the mount; then every process of the run
    is killed at once (a dead rclone leaves a dead FUSE mount), and `down`'s teardown unmounts it
    before it removes the run's folder (which must never walk a bucket)."""
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="gc-ssh-mount")
    s3.put_object(Bucket="gc-ssh-mount", Key="set/a.txt", Body=b"ssh-mount-line\n")
    box = server(lab, "cpu1")
    spec = job(
        tmp_path,
        "sshmount",
        "resources: {cloud: ssh, hosts: [cpu1]}\ninputs: {data/: {source: s3://gc-ssh-mount/set, mode: mount}}\n"
        "run: cat data/a.txt; sleep 300\n",
    )
    run_id, _node = start_detached(cli_env, spec, tmp_path, box)
    parts = box.remote_root / "channel" / "runs" / run_id / "node-0" / "log"
    assert wait_until(lambda: any(b"ssh-mount-line" in p.read_bytes() for p in parts.glob("0*")), 20)
    root = os.path.realpath(box.remote_root / "work" / run_id)
    assert [m for m in mounted_paths() if m.startswith(root)]
    for pid in run_processes(run_id):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert wait_until(lambda: not run_processes(run_id), 10)
    assert [m for m in mounted_paths() if m.startswith(root)], "a killed rclone leaves its mount"
    assert cli("down", run_id, "--yes", cwd=tmp_path, env=cli_env, timeout=180).returncode == 0
    assert [m for m in mounted_paths() if m.startswith(root)] == []
    assert not (box.remote_root / "work" / run_id).exists()
