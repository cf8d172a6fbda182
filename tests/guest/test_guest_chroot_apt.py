"""The stack stage's own apt commands with the guest's real apt and dpkg, without a boot: the stage's
code runs in a chroot of the guest's Debian root against the stand-in of NVIDIA's repositories,
whose packages carry NVIDIA's names, versions, Depends, Conflicts and Provides
(tests/support/guest_chroot.py, guest_apt.py). No qemu: 8-25 s a test (apt and dpkg for real),
with the guest tests' gate (GPUCLOUD_GUEST_TESTS=1 or ci), root, and the guest's root folder."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.guest_chroot import GuestRoot, base_root, chroot_repos, stack_cfg
from tests.support.guest_image import GuestImage
from tests.support.render_inputs import K80, T4

K80_CFG = stack_cfg("K80", replace(K80, framework="none"))
T4_CFG = stack_cfg("T4", replace(T4, framework="none"))
R470, R580 = "470.256.02-1", "580.105.08-1"


@pytest.fixture(scope="module")
def repos(image: GuestImage, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in repositories (the `image` fixture: the gate, root, and the guest's root built)."""
    return chroot_repos(tmp_path_factory.mktemp("nvidia-repos"))


@pytest.fixture
def root(tmp_path: Path, repos: Path) -> Iterator[GuestRoot]:
    base = base_root()
    assert base is not None
    guest = GuestRoot(tmp_path, base, repos)
    try:
        yield guest
    finally:
        guest.close()


def _ok(out: str) -> None:
    assert "STACK OK" in out, out[-3000:]


def test_k80_stack_resolves_on_its_branch_and_a_second_run_installs_nothing(root: GuestRoot) -> None:
    out = root.run_stack(K80_CFG).stdout
    _ok(out)
    have = root.installed()
    assert have["cuda-drivers-470"] == R470 and have["nvidia-driver"] == R470  # the newest is 595
    assert have["nvidia-kernel-dkms"] == R470 and "nvidia-kernel-open-dkms" not in have
    assert have["cuda-toolkit-11-4"] == "11.4.4-1" and have["libcudnn8"] == "8.2.4.15-1+cuda11.4"
    assert root.sh("nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.strip() == "470.256.02"
    again = root.run_stack(K80_CFG).stdout
    _ok(again)
    assert "apt-get install" not in again and "driver 470.256.02 already present" in again


def test_t4_stack_takes_r580_through_its_pinning_package(root: GuestRoot) -> None:
    _ok(root.run_stack(T4_CFG).stdout)
    have = root.installed()
    assert have["nvidia-driver-pinning-580"] == "580-1"
    assert have["cuda-drivers-580"] == R580 and have["nvidia-driver"] == R580  # not 590/595
    assert have["nvidia-kernel-dkms"] == R580 and "nvidia-kernel-open-dkms" not in have


def test_a_branch_switch_on_a_used_disk_goes_to_the_stacks_own_branch(root: GuestRoot) -> None:
    """A disk that ran the K80 stack (R470), then a T4 job (R570 or later): the stage installs
    R580 over it (apt upgrades the driver within its Conflicts); back to the K80's R470, its own
    pin (1001) outranks the R580 pinning package's (1000), so apt goes down to R470 again."""
    _ok(root.run_stack(K80_CFG).stdout)
    out = root.run_stack(T4_CFG).stdout
    _ok(out)
    assert root.installed()["nvidia-driver"] == R580
    back = root.run_stack(K80_CFG).stdout
    _ok(back)
    have = root.installed()
    assert have["nvidia-driver"] == R470 and have["nvidia-kernel-dkms"] == R470, back[-3000:]


def test_a_used_disk_with_the_other_kernel_module_flavour_switches_flavour(root: GuestRoot) -> None:
    """The open kernel modules (nvidia-kernel-open-dkms) on the disk: cuda-drivers-580 needs the
    proprietary ones, which conflict with them; the stage's install replaces them in one step."""
    got = root.sh(
        "dpkg -i /srv/nvidia/ubuntu2204/x86_64/cuda-keyring_1.1-1_all.deb && apt-get update -qq && "
        f"apt-get install -y linux-headers-{os.uname().release} nvidia-kernel-open-dkms=580.105.08-1 2>&1"
    )
    assert got.returncode == 0, got.stdout[-2000:]
    _ok(root.run_stack(T4_CFG).stdout)
    have = root.installed()
    assert have["nvidia-driver"] == R580 and have["nvidia-kernel-dkms"] == R580
    assert "nvidia-kernel-open-dkms" not in have


def test_the_stage_waits_for_first_boot_apt_holding_the_lock_and_says_so(root: GuestRoot) -> None:
    """cloud-init's package_update (apt-get update, then dpkg) holds apt's and dpkg's locks while the
    stack stage starts: the stage waits for them, bounded, names the wait in the status, and
    succeeds; it never fails on "Could not get lock" (dpkg -i of the keyring had no wait at all)."""
    hold = root.spawn(
        'exec python3 -c "import fcntl, time\n'
        "locks = ('/var/lib/dpkg/lock-frontend', '/var/lib/dpkg/lock', '/var/lib/apt/lists/lock')\n"
        "fs = [open(p, 'a') for p in locks]\n"
        "[fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB) for f in fs]\n"
        "print('held', flush=True)\ntime.sleep(6)\"",
    )
    try:
        assert hold.stdout is not None and hold.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        out = root.run_stack(K80_CFG).stdout
        waited = time.monotonic() - t0
    finally:
        hold.kill()
    _ok(out)
    assert "Could not get lock" not in out and "apt is busy: pid" in out and "(python3) holds its lock" in out
    notes = [line for line in out.splitlines() if line.startswith("NOTE ")]
    assert notes[0].startswith("NOTE stack: waiting for apt's lock, held by pid") and notes[-1] == "NOTE ", notes
    assert waited >= 4, waited
