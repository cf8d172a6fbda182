"""An AWS-shaped run on a real booted Debian guest: cloud-init's EC2 datasource fetches gpucloud's
rendered user-data over IMDSv2 and runs it; the shim arms the backstop as a real systemd timer,
the agent runs the job, the channel gets its log, status and artifacts, and the guest's own
`shutdown -h now` ends qemu (the instance is terminated). While the job runs, `gpucloud ssh RUN --
nvidia-smi` reaches the guest by the AWS session path: the instance was launched with the run's key
pair, cloud-init installed its public half for the login user, and the guest's sshd answers on the
port the user's ssh_config maps the node's entry to (tests/support/guest_session.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.support.guest_apt import RepoServer
from tests.support.guest_image import GuestImage
from tests.support.guest_runs import GuestRun, start_guest_run
from tests.support.guest_session import INSTANCE_TYPE, record_aws_run, session_key
from tests.support.moto_server import Moto, moto, moto_server  # noqa: F401
from tests.support.vm_sim import GPU_NAMES, gpu_of

pytestmark = pytest.mark.slow
BOOT_S = 900  # one TCG boot is minutes; the bound only has to end a hung guest
JOB = (
    "echo first-line-of-job\n"
    'echo "cgroup: $(cut -d: -f3 /proc/self/cgroup)"\n'
    'echo "pid1: $(cat /proc/1/comm)"\n'
    "systemctl list-timers --all --no-legend 'gpucloud-backstop-*' | sed 's/^/timer: /'\n"
    "mkdir -p outputs && uname -r > outputs/kernel.txt\n"
    "dpkg-query -W -f='pkg ${Package} ${Version}\\n' cuda-drivers-580 nvidia-driver nvidia-driver-pinning-580\n"
    "nvidia-smi --query-gpu=name,driver_version --format=csv,noheader\n"
    # held until the test's ssh sessions are done (bounded: a failed test still ends the guest)
    "for i in $(seq 400); do [ -e /var/tmp/sessions-done ] && break; sleep 1; done\n"
    "echo sessions-done-seen-after-$i\n"
)


def _ssh_while_the_job_runs(run: GuestRun, moto: Moto, home: Path, key: tuple[Path, str]) -> None:  # noqa: F811
    """`gpucloud ssh RUN -- nvidia-smi` once the job runs: the instance type's GPU; then a second
    session tells the job it may end."""
    session = record_aws_run(moto, home, run.vm.run_id, key[0], key[1], run.ssh_port)
    try:
        end = time.monotonic() + BOOT_S
        while run.first_line_at is None and run.guest.proc.poll() is None and time.monotonic() < end:
            time.sleep(1)
        assert run.first_line_at is not None, run.guest.console()[-4000:]
        smi = session.ssh("nvidia-smi")
        assert smi.returncode == 0, (smi.stdout, smi.stderr, run.guest.console()[-3000:])
        gpu, count = gpu_of("aws", INSTANCE_TYPE)
        assert smi.stdout.splitlines() == [f"GPU {i}: {GPU_NAMES[gpu]}" for i in range(count)], smi.stdout
        done = session.ssh("id -un; touch /var/tmp/sessions-done")
        assert done.returncode == 0 and done.stdout.strip() == "ubuntu", (done.stdout, done.stderr)
    finally:
        session.end()


def test_aws_run_through_cloud_init_ends_terminated(
    image: GuestImage,
    repo: RepoServer,
    moto: Moto,  # noqa: F811
    gpucloud_home: Path,
    tmp_path: Path,
) -> None:
    key = session_key(tmp_path / "key")
    run = start_guest_run(
        tmp_path, image, repo, run=JOB, artifacts=["outputs/"], max_duration=1800, session_key=("guest-run-key", key[1])
    )
    try:
        run.watch_first_line("first-line-of-job")
        started = time.monotonic()
        _ssh_while_the_job_runs(run, moto, gpucloud_home, key)
        sessions_s = time.monotonic() - (run.first_line_at or started)
        assert run.guest.wait_exit(BOOT_S) == 0, run.guest.console()[-4000:]
        assert run.state == "terminated"
        status = run.vm.status()
        assert status["state"] == "succeeded", (status, run.guest.console()[-4000:])
        log = run.vm.job_output()
        assert "first-line-of-job" in log
        assert "pid1: systemd" in log
        assert "cloud-final.service" in log  # the agent and job run where cloud-init runs user scripts
        assert "timer: " in log and "gpucloud-backstop-" in log, log  # a real transient systemd timer
        # the T4 stack (R580, its pinning package first) from the stand-in repository with real apt
        for line in ("pkg cuda-drivers-580 580.105.08-1", "pkg nvidia-driver 580.105.08-1", "Tesla T4, 580.105.08"):
            assert line in log, (line, log)
        assert "pkg nvidia-driver-pinning-580 580-1" in log
        got = run.vm.channel.download_artifacts(run.vm.run_id, 0, tmp_path / "artifacts")
        assert got is not None
        kernel = next((tmp_path / "artifacts").rglob("kernel.txt")).read_text()
        assert "cloud-amd64" in kernel
        # cloud-init took the user-data through IMDSv2: a token first, every GET carrying it
        seen = run.imds.seen
        assert seen[0] == "PUT /latest/api/token", seen[:5]
        assert any(s.endswith("/user-data") for s in seen), seen
        assert "Cloud-init" in run.guest.console()
        assert "sessions-done-seen-after-" in log and any(s.endswith("/public-keys/0/openssh-key") for s in seen), seen
        marks = {"qemu exit": round(run.guest.lines[-1][0], 1), "ssh sessions (s)": round(sessions_s, 1), **run.marks()}
        out = os.environ.get("GPUCLOUD_GUEST_MARKS")
        if out:
            Path(out).write_text(json.dumps({"marks": marks, "console": run.guest.lines}, indent=1))
        print(marks)
    finally:
        run.stop()
