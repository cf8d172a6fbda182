"""A `container:` job's stack stage (gpucloud/vm/agent/stack.py), run for real against the stub VM:
the driver as for any job, then a container engine (the image's docker or podman, else Ubuntu's
docker.io) and NVIDIA's container toolkit (pinned, from its own apt source), then the engine given the
GPUs (docker's nvidia runtime, podman's CDI spec) -- each only where missing (docs/STACKS.md,
"Containers"). docker, podman and nvidia-ctk are stubs of this file (they answer once "installed")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucloud.plan.container import ImageCuda
from gpucloud.plan.container_stack import container_stack
from gpucloud.plan.stack_data import CONTAINER_TOOLKIT_PACKAGES
from gpucloud.vm.agent import stack
from gpucloud.vm.agent.stage_api import StageFailed
from tests.support.render_inputs import K80
from tests.vm.conftest import APT, APT_UPDATE, LOCK_580, StubVm, config, installed_only

IMAGE = ImageCuda("nvcr.io/nvidia/pytorch:24.08-py3", "nvcr.io", "12.6", "ngc-table", "test")
T4_HOST = container_stack("T4", None, IMAGE)
PLAIN = config(T4_HOST, "azure", "T4", 1, "Standard_NC4as_T4_v3")  # Canonical's Ubuntu: nothing NVIDIA
DLAMI = config(T4_HOST, "aws", "T4", 1, "g4dn.xlarge")  # the Deep Learning Base AMI: docker and the toolkit
TOOLKIT = APT + " ".join(CONTAINER_TOOLKIT_PACKAGES)
CTK_STUB = """case "$1" in
  --version) echo "NVIDIA Container Toolkit CLI version 1.20.1"; exit 0;;
  runtime) cfg=${4#--config=}; mkdir -p "$(dirname "$cfg")"
    grep -q nvidia "$cfg" 2>/dev/null || printf '{"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}' >"$cfg"
    exit 0;;
  cdi) out=${3#--output=}; mkdir -p "$(dirname "$out")"; echo "cdiVersion: 0.5.0" >"$out"; exit 0;;
esac
exit 2
"""


def host_vm(
    tmp_path: Path,
    *,
    docker: bool = False,
    podman: bool = False,
    ctk: bool = False,
    podman_version: str = "5.2.0",
    **env: str,
) -> StubVm:
    """A stub VM whose docker/podman/nvidia-ctk answer only when installed (or present from the start)."""
    repo = tmp_path / "ctk-repo"
    repo.mkdir(exist_ok=True)
    (repo / "gpgkey").write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\nfake\n-----END PGP PUBLIC KEY BLOCK-----\n")
    stub_env = {"GPUCLOUD_NVIDIA_CTK_REPO": repo.as_uri(), **env}
    stub_env.update({k: "1" for k, on in (("STUB_DOCKER", docker), ("STUB_PODMAN", podman), ("STUB_CTK", ctk)) if on})
    vm = StubVm(tmp_path, stub_env=stub_env)
    vm.override("docker", installed_only("docker.io", "STUB_DOCKER") + "exit 0\n")
    vm.override("podman", installed_only("podman", "STUB_PODMAN") + f"echo 'podman version {podman_version}'\n")
    ctk_stub = installed_only("nvidia-container-toolkit", "STUB_CTK") + CTK_STUB
    vm.override("nvidia-ctk", ctk_stub)
    return vm


def _run(vm: StubVm, cfg: dict) -> None:
    stack.run(cfg, vm.env(cfg))


def test_plain_ubuntu_gets_driver_then_docker_then_the_pinned_toolkit_then_nothing_again(tmp_path: Path) -> None:
    vm = host_vm(tmp_path)
    _run(vm, PLAIN)
    assert vm.apt_installs() == [LOCK_580, APT + "cuda-drivers-580", APT + "docker.io", TOOLKIT]
    assert vm.calls().count(APT_UPDATE) == 2  # once, and again after the toolkit's source was added
    assert not vm.pip_installs() and not any("cuda-toolkit" in c or "cudnn" in c for c in vm.calls())
    key = vm.etc / "apt" / "keyrings" / "nvidia-container-toolkit.asc"
    assert key.read_text().startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    source = (vm.etc / "apt" / "sources.list.d" / "nvidia-container-toolkit.list").read_text()
    assert source == f"deb [signed-by={key}] {(tmp_path / 'ctk-repo').as_uri()}/stable/deb/$(ARCH) /\n"
    daemon = vm.etc / "docker" / "daemon.json"
    assert f"nvidia-ctk runtime configure --runtime=docker --config={daemon}" in vm.calls()
    assert "nvidia" in json.loads(daemon.read_text())["runtimes"]
    assert "systemctl restart docker" in vm.calls()
    assert "[gpucloud] docker: NVIDIA runtime configured\n" in vm.log()

    (vm.state / "calls").unlink()  # the same disk boots again (a reboot, a baked image): nothing to do
    again = host_vm(tmp_path)
    _run(again, PLAIN)
    assert not any(c.startswith(("apt-get", "dpkg -i", "curl")) for c in again.calls())
    assert "systemctl restart docker" not in again.calls()
    assert "container engine: docker: docker (no podman here)" in again.log()
    assert "NVIDIA container toolkit already present" in again.log()
    assert "docker: NVIDIA runtime already configured" in again.log()


def test_vendor_image_with_docker_and_the_toolkit_installs_nothing(tmp_path: Path) -> None:
    vm = host_vm(
        tmp_path,
        docker=True,
        ctk=True,
        STUB_DRIVER="595.91.07",
        STUB_PREINSTALLED="cuda-keyring=1.1-1",
    )
    daemon = vm.etc / "docker" / "daemon.json"
    daemon.parent.mkdir(parents=True)
    daemon.write_text('{"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}')
    assert DLAMI["image_name"] == "dlami-base-oss"
    _run(vm, DLAMI)
    assert vm.apt_installs() == [] and "systemctl restart docker" not in vm.calls()
    assert "driver 595.91.07 already present" in vm.log()


def test_podman_gets_a_cdi_spec_and_no_docker(tmp_path: Path) -> None:
    vm = host_vm(tmp_path, podman=True)
    _run(vm, PLAIN)
    assert APT + "docker.io" not in vm.apt_installs() and TOOLKIT in vm.apt_installs()
    spec = vm.etc / "cdi" / "nvidia.yaml"
    assert f"nvidia-ctk cdi generate --output={spec}" in vm.calls() and spec.read_text().startswith("cdiVersion")
    assert "container engine: podman: podman 5.2.0 gives the GPUs through CDI" in vm.log()


def test_podman_that_cannot_read_the_pinned_toolkits_cdi_spec_gets_docker(tmp_path: Path) -> None:
    """Ubuntu 24.04's podman 4.9 and the pinned toolkit (CDI schema 0.7.0): docker is installed and
    configured, and the log says why in one line."""
    vm = host_vm(tmp_path, podman=True, podman_version="4.9.3")
    _run(vm, PLAIN)
    assert APT + "docker.io" in vm.apt_installs() and TOOLKIT in vm.apt_installs()
    assert "nvidia-ctk cdi generate" not in " ".join(vm.calls())
    assert "--runtime=docker" in " ".join(vm.calls())
    why = [line for line in vm.log().splitlines() if "container engine: docker:" in line]
    assert len(why) == 1 and "podman 4.9.3 cannot read the CDI spec" in why[0] and "#1860" in why[0]


def test_a_toolkit_source_that_cannot_be_fetched_fails_the_stage(tmp_path: Path) -> None:
    vm = host_vm(tmp_path)
    (tmp_path / "ctk-repo" / "gpgkey").unlink()
    with pytest.raises(StageFailed) as exc:
        _run(vm, PLAIN)
    assert "stack install failed" in str(exc.value)
    assert TOOLKIT not in vm.apt_installs()


def test_an_engine_that_will_not_install_fails_the_stage(tmp_path: Path) -> None:
    vm = host_vm(tmp_path)
    vm.override("docker", "exit 127\n")  # apt says yes, but no docker runs
    with pytest.raises(StageFailed):
        _run(vm, PLAIN)
    assert "no container engine" in vm.log()


def test_a_cpu_container_job_installs_only_an_engine(tmp_path: Path) -> None:
    cpu = config(container_stack(None, None, IMAGE), "aws", "", 0, "c5.xlarge")
    assert cpu["container"] == {
        "engine_packages": ["docker.io"],
        "toolkit_packages": [],
        "toolkit_repo": "https://nvidia.github.io/libnvidia-container",
    }
    vm = host_vm(tmp_path)
    _run(vm, cpu)
    assert vm.apt_installs() == [APT + "docker.io"]
    assert not any(c.startswith("nvidia-ctk") for c in vm.calls())


def test_the_config_carries_the_host_packages_only_for_a_container_job() -> None:
    assert PLAIN["container"]["toolkit_packages"] == list(CONTAINER_TOOLKIT_PACKAGES)
    assert PLAIN["cuda_packages"] == [] and PLAIN["cudnn_packages"] == [] and PLAIN["framework_pip"] == []
    assert PLAIN["driver_packages"] == ["cuda-drivers-580"]
    assert "container" not in config(K80, "aws", "K80", 1, "p2.xlarge")  # a job without `container:`
