"""Faults on the real guest, each ended by its bound: the agent SIGKILLed (the backstop, a real
systemd timer, reports and powers the guest off), a job that ignores SIGTERM (ended at the
deadline), and a reboot mid-run (the run ends `error`, the job never runs twice, the deadline
survives). What the channel holds must be the truth."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.guest_apt import RepoServer, preinstall_driver
from tests.support.guest_image import GuestImage
from tests.support.guest_runs import start_guest_run
from tests.support.guest_vm import guest_disk

pytestmark = pytest.mark.slow
BOOT_S = 900  # boot to the job: minutes under software emulation
MAX_S = 180  # max_duration: from the shim's start, past the agent's start (about 40 s under TCG)


def _run_and_wait(tmp: Path, image: GuestImage, repo: RepoServer, job: str) -> tuple[dict, str, float]:
    """Boot a run of `job` with MAX_S on a disk with the driver in place (no stack install, as from an
    image with the driver baked in); (status, job output, seconds from the shim's start to qemu's end)."""
    tmp.mkdir(parents=True, exist_ok=True)
    disk = guest_disk(image, tmp / "disk.raw")
    preinstall_driver(disk, image.kernel_release, "580.105.08")
    run = start_guest_run(tmp, image, repo, run=job, max_duration=MAX_S, deadline_s=3600, disk=disk)
    try:
        assert run.guest.wait_exit(BOOT_S + MAX_S) == 0, run.guest.console()[-3000:]
        assert run.state == "terminated"
        shim = run.front.first("GET", "/manifest")
        assert shim is not None
        return run.vm.status(), run.vm.job_output(), time.monotonic() - shim
    finally:
        run.stop()


def test_agent_sigkilled_the_backstop_ends_the_guest(image: GuestImage, repo: RepoServer, tmp_path: Path) -> None:
    job = "echo job-started\npkill -KILL -f 'gpucloud.vm.agent run' || echo no-agent-found\nsleep 100000\n"
    status, out, took = _run_and_wait(tmp_path, image, repo, job)
    assert "job-started" in out and "no-agent-found" not in out
    assert status["state"] == "deadline", status
    grace = 30
    assert MAX_S + grace - 5 <= took <= MAX_S + grace + 120, took  # the timer, then the poweroff


def test_job_ignoring_sigterm_is_ended_at_the_deadline(image: GuestImage, repo: RepoServer, tmp_path: Path) -> None:
    job = "trap '' TERM\necho job-started\nwhile :; do sleep 1; done\n"
    status, out, took = _run_and_wait(tmp_path, image, repo, job)
    assert "job-started" in out
    assert status["state"] == "deadline", status
    assert MAX_S - 5 <= took <= MAX_S + 30 + 120, took  # the agent's deadline (or the backstop at the latest)


def test_reboot_mid_run_keeps_the_deadline_and_never_reruns_the_job(
    image: GuestImage, repo: RepoServer, tmp_path: Path
) -> None:
    job = "echo job-started-$(date +%s) >>/var/tmp/job-starts\ncat /var/tmp/job-starts\nsystemctl reboot\nsleep 600\n"
    status, out, took = _run_and_wait(tmp_path, image, repo, job)
    assert out.count("job-started-") == 1, out
    # the resumed run reports the reboot; if the deadline passed while the guest was down (a TCG
    # reboot takes minutes), the re-armed backstop ends it as `deadline` (docs/STACKS.md, "Reboots")
    rebooted = status["state"] == "error" and "rebooted during stage run" in status["message"]
    assert rebooted or status["state"] == "deadline", status
    assert took <= MAX_S + 30 + 120, took
