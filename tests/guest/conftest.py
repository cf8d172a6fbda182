"""The real booted guest (tests/support/guest_image.py, guest_vm.py): built once per recipe and
cached; every test boots its own copy of the disk under qemu's software emulation.

A boot costs minutes of one CPU core (BENCHMARKS.md, "Node side on a real guest"), so these tests
run only with GPUCLOUD_GUEST_TESTS set (as root, with qemu-system-x86, debootstrap, dpkg-dev and
apt-utils installed, and Debian's mirror reachable for the first build). `ci`, what .ci/run sets by
default, is the one-boot set (the AWS run through cloud-init with the T4 stack and a `gpucloud ssh`
session while its job runs; plus the chroot apt tests, no boot), handed out first so its boot
overlaps the rest of the suite; `1` runs them all. .ci/run starts the image build in the background
before the tests: the `image` fixture then waits on the build's lock."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.guest_apt import RepoServer, build_repos
from tests.support.guest_image import GuestImage, guest_image, missing_tools

GATE = "GPUCLOUD_GUEST_TESTS"
CI_SET = ("tests/guest/test_guest_aws.py", "tests/guest/test_guest_chroot_apt.py", "tests/guest/test_guest_findings.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With the gate set, the guest's files go first: under xdist (one worker per file, tests/support/xdist_files.py)
    a worker starts its boot at once and the rest of the suite runs beside it. With `ci`, the files
    outside the CI set are skipped here, before their session fixtures (the image, the repositories)
    would be set up for nothing."""
    gate = os.environ.get(GATE)
    if gate in ("1", "ci"):
        items.sort(key=lambda item: not item.nodeid.startswith("tests/guest/"))
    if gate == "ci":
        skip = pytest.mark.skip(reason=f"not in the guest tests' CI set ({GATE}=1 runs them all)")
        for item in items:
            if item.nodeid.startswith("tests/guest/") and not item.nodeid.startswith(CI_SET):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def image() -> GuestImage:
    """The cached guest image (built now when the recipe changed), or a skip saying what is missing."""
    gate = os.environ.get(GATE)
    if gate not in ("1", "ci"):
        pytest.skip(f"real-guest tests run with {GATE}=ci (the CI set) or =1 (all): minutes of CPU under emulation")
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
