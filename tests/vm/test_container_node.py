"""`container:` on a simulated GPU machine (the rendered shim and agent, aws hooks, stub nvidia-smi)
with the real podman: the GPUs reach the container through a CDI spec made by `nvidia-ctk` (a stub
that writes a real spec whose device `all` injects one variable: podman applies it for real), and a
spot notice reaches the containerised job (SIGTERM through the engine, the preempted file on the
mounted notice folder, the checkpoint it saved uploaded); no container is left. Without nvidia-ctk
and without a CDI spec, container_pull fails saying so.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpucloud.spec.container import ContainerSpec
from tests.support.container_gpu import no_cdi_spec  # noqa: F401
from tests.support.containers import ContainerLab, container_lab, podman  # noqa: F401
from tests.support.fake_imds import FakeImds, imds  # noqa: F401
from tests.support.polling import wait_until
from tests.support.vm_boot import STUBS, make_vm

pytestmark = pytest.mark.slow

NVIDIA_CTK = """#!/bin/sh
# the toolkit before CDI schema 0.7.0, which this podman (4.3) reads: the engine decision keeps podman
if [ "$1" = --version ]; then echo "NVIDIA Container Toolkit CLI version 1.18.2"; exit 0; fi
echo "$@" >> "$STUB_STATE/nvidia-ctk.calls"
out=""
for a in "$@"; do case "$a" in --output=*) out="${a#--output=}" ;; esac; done
mkdir -p "$(dirname "$out")"
cat > "$out" <<'EOF'
cdiVersion: "0.5.0"
kind: nvidia.com/gpu
devices:
  - name: all
    containerEdits:
      env:
        - GPUCLOUD_TEST_GPU=injected
EOF
"""
TRAP_JOB = (
    'trap \'echo saved > ckpt/state; echo "file: $(cat "$GPUCLOUD_PREEMPTED_FILE")"; exit 143\' TERM; '
    'echo "gpu=$GPUCLOUD_TEST_GPU n=$GPUCLOUD_NUM_GPUS_PER_NODE"; mkdir -p ckpt; echo running > ckpt/state; '
    "echo started; while :; do sleep 0.1; done"
)


def _path(tmp_path: Path, with_ctk: bool) -> str:
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    if with_ctk:
        (tools / "nvidia-ctk").write_text(NVIDIA_CTK)
        (tools / "nvidia-ctk").chmod(0o755)
    return f"{tools}:{STUBS}:{os.environ.get('PATH', '/usr/bin:/bin')}"


def containers_of(run_id: str) -> list[str]:
    return podman("ps", "-a", "--format", "{{.Names}}", "--filter", f"name=gpucloud-{run_id}").stdout.decode().split()


def test_gpu_container_gets_cdi_devices_and_a_spot_notice(
    tmp_path: Path, container_lab: ContainerLab, imds: type[FakeImds], no_cdi_spec: Path
) -> None:
    url = imds.url  # type: ignore[attr-defined]
    vm = make_vm(
        tmp_path,
        provider="aws",
        gpu="K80",
        run=TRAP_JOB,
        spot={"checkpoint": "ckpt", "checkpoint_interval": 600, "container": ContainerSpec(image=container_lab.image)},
        stub_env={
            "STUB_GPU_NAME": "Tesla K80",
            "STUB_DRIVER": "470.82.01",
            "GPUCLOUD_IMDS_ENDPOINT": url,
            "CONTAINERS_CONF": os.environ["CONTAINERS_CONF"],
            "PATH": _path(tmp_path, with_ctk=True),
        },
    ).start()
    assert wait_until(lambda: "started" in vm.log(), 60), vm.log()
    assert containers_of(vm.run_id) == [f"gpucloud-{vm.run_id}-0-run"]
    imds.preempted = True
    vm.wait(60)
    status = vm.status()
    assert status["state"] == "preempted" and "spot interruption notice" in status["message"], status
    log = vm.log()
    assert "gpu=injected n=1" in log, log  # podman applied the CDI device `all`
    assert (vm.state / "nvidia-ctk.calls").read_text() == f"cdi generate --output={no_cdi_spec}\n"
    assert "file: GPUCLOUD_PREEMPTED=1" in log and "checkpoint 1 uploaded (notice" in log, log
    assert (vm.vm_dir / "job" / "ckpt" / "state").read_text() == "saved\n"
    assert vm.rc == 143 and containers_of(vm.run_id) == []


def test_gpu_machine_without_cdi_or_nvidia_ctk_fails_the_pull_stage(
    tmp_path: Path, container_lab: ContainerLab, no_cdi_spec: Path
) -> None:
    vm = make_vm(
        tmp_path,
        provider="aws",
        gpu="K80",
        run="echo never-ran",
        spot={"container": ContainerSpec(image=container_lab.image)},
        stub_env={
            "STUB_GPU_NAME": "Tesla K80",
            "STUB_DRIVER": "470.82.01",
            "CONTAINERS_CONF": os.environ["CONTAINERS_CONF"],
            "PATH": _path(tmp_path, with_ctk=False),
        },
    ).start()
    vm.wait(60)
    status = vm.status()
    assert status["state"] == "error" and status["stages"]["container_pull"]["ok"] is False, status
    assert "no CDI spec for them" in status["message"] and "nvidia-ctk" in status["message"]
    assert "never-ran" not in vm.log().replace("echo never-ran", "")
