"""An AWS-shaped run on a real booted Debian guest: cloud-init's EC2 datasource fetches gpucloud's
rendered user-data over IMDSv2 and runs it; the shim arms the backstop as a real systemd timer,
the agent runs the job, the channel gets its log, status and artifacts, and the guest's own
`shutdown -h now` ends qemu (the instance is terminated)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.guest_apt import RepoServer
from tests.support.guest_image import GuestImage
from tests.support.guest_runs import start_guest_run

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
)


def test_aws_run_through_cloud_init_ends_terminated(image: GuestImage, repo: RepoServer, tmp_path: Path) -> None:
    run = start_guest_run(tmp_path, image, repo, run=JOB, artifacts=["outputs/"], max_duration=1800)
    try:
        run.watch_first_line("first-line-of-job")
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
        marks = {"qemu exit": round(run.guest.lines[-1][0], 1), **run.marks()}
        out = os.environ.get("GPUCLOUD_GUEST_MARKS")
        if out:
            Path(out).write_text(json.dumps({"marks": marks, "console": run.guest.lines}, indent=1))
        print(marks)
    finally:
        run.stop()
