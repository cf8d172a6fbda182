"""What a simulated GPU machine needs to run a `container:` job with the real podman, for any simulator
(tests/support/vm_sim.py: AWS, Azure): the NVIDIA container toolkit on the guests' PATH (a stub
`nvidia-ctk`: this machine has no network for its apt source) and a CDI spec for the GPUs (device
`all` injects GPUCLOUD_TEST_GPU, which podman applies for real).

podman reads CDI specs only from /etc/cdi and /var/run/cdi, so the spec is a file of the whole machine,
shared by the test processes running side by side (pytest-xdist). A file lock orders them: tests
that use the spec hold it shared (the first writes the spec, the last one out removes it), a test
that needs the machine without a spec holds it exclusively.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucloud.vm.agent import container
from tests.support.vm_sim import GuestSimulator

CDI_SPEC = """\
cdiVersion: "0.5.0"
kind: nvidia.com/gpu
devices:
  - name: all
    containerEdits:
      env:
        - GPUCLOUD_TEST_GPU=cdi-all
"""
NVIDIA_CTK = """#!/bin/sh
case "$1" in
  --version) echo "NVIDIA Container Toolkit CLI version 1.17.8" ;;
  runtime) cfg=${4#--config=}; mkdir -p "$(dirname "$cfg")"; echo '{"runtimes": {"nvidia": {}}}' > "$cfg" ;;
  cdi) out=${3#--output=}; mkdir -p "$(dirname "$out")"; printf 'kind: nvidia.com/gpu\n' > "$out" ;;
  *) exit 2 ;;
esac
"""
LOCK = Path(tempfile.gettempdir()) / "gpucloud-test-cdi.lock"


def _other_nvidia_spec(ours: Path) -> bool:
    """An NVIDIA CDI spec on this machine besides the one these fixtures write (`ours`)."""
    for folder in map(Path, container.CDI_DIRS):
        for path in sorted(folder.glob("*")) if folder.is_dir() else []:
            if path == ours or path.suffix not in (".yaml", ".yml", ".json"):
                continue
            try:
                if "nvidia.com/gpu" in path.read_text(errors="replace"):
                    return True
            except OSError:
                continue
    return ours.is_file() and ours.read_text() != CDI_SPEC


@pytest.fixture
def toolkit_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every simulated guest's PATH gets a stub nvidia-ctk, as on an image that has the container toolkit."""
    tools = tmp_path / "ctk"
    tools.mkdir()
    (tools / "nvidia-ctk").write_text(NVIDIA_CTK)
    (tools / "nvidia-ctk").chmod(0o755)
    plain = GuestSimulator.guest_env

    def guest_env(self: GuestSimulator, sandbox: Path, gpu: str, count: int) -> dict[str, str]:
        return {**plain(self, sandbox, gpu, count), "PATH": f"{tools}:{os.environ.get('PATH', '/usr/bin:/bin')}"}

    monkeypatch.setattr(GuestSimulator, "guest_env", guest_env)


@pytest.fixture
def cdi_spec() -> Iterator[Path]:
    """The machine's GPUs described for podman, as `nvidia-ctk cdi generate` would leave them; kept
    while any test process still uses it."""
    out = Path(container.CDI_OUT)
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        try:
            if _other_nvidia_spec(out):
                pytest.skip("this machine has a CDI spec for NVIDIA GPUs already")
            if not out.is_file():
                out.parent.mkdir(parents=True, exist_ok=True)
                tmp = out.with_name(f".{out.name}.{os.getpid()}")
                tmp.write_text(CDI_SPEC)
                tmp.rename(out)
            yield out
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another test process still uses the spec: the last one out removes it
        try:
            out.unlink(missing_ok=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture
def no_cdi_spec() -> Iterator[Path]:
    """A machine whose GPUs have no CDI spec yet (tests that use one wait); the spec the test makes
    (its nvidia-ctk writes CDI_OUT) is removed after."""
    out = Path(container.CDI_OUT)
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if out.is_file() and out.read_text() == CDI_SPEC:
                out.unlink()  # left by a test process that died: nobody uses it now
            if container.cdi_has_nvidia():
                pytest.skip("this machine has a CDI spec for NVIDIA GPUs already (the stub nvidia-ctk would not run)")
            yield out
            out.unlink(missing_ok=True)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
