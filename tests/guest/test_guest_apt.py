"""The stack stage's own apt commands on the real guest, against the stand-in of NVIDIA's
repository (tests/support/guest_apt.py): the K80 stack (R470, CUDA 11.4, cuDNN 8.2) installs with
real apt and dpkg, and a second machine booted from the same disk (the first run's folder and
resume unit still on it) runs its own job and installs nothing. (The T4 stack,
R580 with its pinning package, is installed by tests/guest/test_guest_aws.py's run.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.guest_apt import RepoServer
from tests.support.guest_image import GuestImage
from tests.support.guest_runs import start_guest_run
from tests.support.vm_boot import Vm

pytestmark = pytest.mark.slow
BOOT_S = 1200
JOB = (
    "dpkg-query -W -f='pkg ${Package} ${Version}\\n' cuda-drivers-470 nvidia-driver nvidia-kernel-dkms "
    "cuda-toolkit-11-4 libcudnn8\n"
    "nvidia-smi --query-gpu=name,driver_version --format=csv,noheader\n"
    "ls -d /usr/local/cuda-11.4\n"
)


def _boot(tmp: Path, image: GuestImage, repo: RepoServer, disk: Path | None, instance: str) -> tuple[Vm, dict, str]:
    run = start_guest_run(tmp, image, repo, gpu="K80", run=JOB, disk=disk, instance_id=instance)
    try:
        assert run.guest.wait_exit(BOOT_S) == 0, run.guest.console()[-3000:]
        return run.vm, run.vm.status(), run.vm.log()
    finally:
        run.stop()


def test_k80_stack_installs_with_real_apt_and_a_second_boot_installs_nothing(
    image: GuestImage, repo: RepoServer, tmp_path: Path
) -> None:
    first, status, log = _boot(tmp_path / "first", image, repo, None, "i-0first")
    assert status["state"] == "succeeded", (status, log[-3000:])
    assert "apt-get install cuda-drivers-470" in log
    for line in (
        "pkg cuda-drivers-470 470.256.02-1",
        "pkg nvidia-driver 470.256.02-1",  # R470 held: the newest nvidia-driver is 595
        "pkg nvidia-kernel-dkms 470.256.02-1",
        "pkg cuda-toolkit-11-4 11.4.4-1",
        "pkg libcudnn8 8.2.4.15-1+cuda11.4",
        "Tesla K80, 470.256.02",
    ):
        assert line in log, (line, log[-3000:])
    # A new machine (another instance id, SMBIOS UUID and user-data) from this disk, whose run folder
    # and enabled resume unit are still there: the old run is not resumed (it would re-arm its past
    # deadline and power the new machine off), and the new machine's own run finds the stack installed.
    before = first.status()
    _, status, again = _boot(tmp_path / "second", image, repo, tmp_path / "first" / "disk.raw", "i-0second")
    assert status["state"] == "succeeded", (status, again[-3000:])
    assert "apt-get install" not in again, again[-3000:]
    assert "Tesla K80, 470.256.02" in again
    assert first.status() == before  # the old run's channel untouched
