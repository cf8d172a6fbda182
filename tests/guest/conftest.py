"""The real booted guest (tests/support/guest_image.py, guest_vm.py): built once per recipe and
cached; every test boots its own copy of the disk under qemu's software emulation.

A boot costs minutes of one CPU core (BENCHMARKS.md, "Node side on a real guest"), more than CI's
time budget holds beside the rest of the suite, so these tests run only when GPUCLOUD_GUEST_TESTS=1
(as root, with qemu-system-x86, debootstrap, dpkg-dev and apt-utils installed, and Debian's mirror
reachable for the first build)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.guest_apt import RepoServer, build_repos
from tests.support.guest_image import GuestImage, guest_image, missing_tools

GATE = "GPUCLOUD_GUEST_TESTS"


@pytest.fixture(scope="session")
def image() -> GuestImage:
    """The cached guest image (built now when the recipe changed), or a skip saying what is missing."""
    if os.environ.get(GATE) != "1":
        pytest.skip(f"real-guest tests run with {GATE}=1 (minutes of CPU under software emulation)")
    if os.geteuid() != 0:
        pytest.skip("building the guest image needs root (debootstrap's chroot)")
    missing = missing_tools()
    if missing:
        pytest.skip("not installed: " + ", ".join(missing))
    return guest_image()


@pytest.fixture(scope="session")
def repo(image: GuestImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RepoServer]:
    """NVIDIA's repositories' stand-in for this guest's kernel, served over HTTP."""
    server = RepoServer(build_repos(tmp_path_factory.mktemp("nvidia-repos"), image.kernel_release)).start()
    yield server
    server.stop()
