"""A job that mounts a bucket folder (`mode: mount`) gets rclone and FUSE from the stack stage where
the image lacks them (gpucloud/vm/agent/stack.py `mount_tools`): the inputs stage mounts before the
job's own setup runs, and the clouds' stock Ubuntu images have no rclone. Run for real against the
stub VM; rclone and fusermount3 are stubs of this file that answer only once installed (or present
from the start). The CLI side: the agent config asks for them only when an input is mounted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucloud.plan.stacks import resolve_stack
from gpucloud.vm.agent import stack
from gpucloud.vm.agent.stage_api import StageFailed
from gpucloud.vm.stack_config import MOUNT_PACKAGES
from tests.support.cli import cli
from tests.vm.conftest import APT, StubVm, config, installed_only

INSTALLED_ONLY = (
    'source "{stubs}/_common.sh"\nrecord "$@"\n[[ -f $STUB_STATE/pkgs/{pkg} || -n ${{{flag}:-}} ]] || exit 127\n'
)
MOUNTS = {**config(resolve_stack("T4"), "aws", "T4", 1, "g4dn.xlarge"), "mount_packages": list(MOUNT_PACKAGES)}


def mount_vm(tmp_path: Path, *, rclone: bool = False, fuse: bool = True) -> StubVm:
    flags = {"STUB_RCLONE": rclone, "STUB_FUSE": fuse}
    vm = StubVm(tmp_path, stub_env={k: "1" for k, on in flags.items() if on})
    vm.override("rclone", installed_only("rclone", "STUB_RCLONE") + "echo rclone v1.60\n")
    vm.override("fusermount3", installed_only("fuse3", "STUB_FUSE") + "exit 0\n")
    # the driver is there (a vendor image): only what the mounts need is left to install
    vm.preinstall(**{"cuda_drivers_580": "580.95.05-1", "nvidia_driver_pinning_580": "580.95.05-1"})
    return vm


def test_an_image_without_rclone_gets_rclone_and_fuse(tmp_path: Path) -> None:
    vm = mount_vm(tmp_path)
    stack.run(MOUNTS, vm.env(MOUNTS))
    assert APT + "rclone fuse3" in vm.apt_installs()
    assert vm.installed("rclone") is not None and "rclone version" in vm.calls()


def test_an_image_with_rclone_and_fuse_installs_nothing_for_them(tmp_path: Path) -> None:
    vm = mount_vm(tmp_path, rclone=True)
    stack.run(MOUNTS, vm.env(MOUNTS))
    assert not any("rclone" in call for call in vm.apt_installs())
    assert "rclone and FUSE already present" in vm.log()


def test_rclone_that_does_not_run_after_its_install_fails_the_stage(tmp_path: Path) -> None:
    vm = mount_vm(tmp_path)
    vm.override("rclone", "exit 127\n")  # apt says yes, but no rclone runs
    with pytest.raises(StageFailed) as exc:
        stack.run(MOUNTS, vm.env(MOUNTS))
    assert "stack install failed" in str(exc.value)
    assert "installing rclone fuse3 for the mounted inputs failed" in vm.log()


def test_a_job_without_mounts_installs_no_rclone(tmp_path: Path) -> None:
    cfg = config(resolve_stack("T4"), "aws", "T4", 1, "g4dn.xlarge")
    assert "mount_packages" not in cfg
    vm = mount_vm(tmp_path)
    stack.run(cfg, vm.env(cfg))
    assert not any("rclone" in call for call in vm.calls())


@pytest.mark.parametrize("mode", ["mount", "copy"])
def test_the_agent_config_asks_for_them_only_when_an_input_is_mounted(mode: str, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: mounted\nresources:\n  cloud: aws\n  gpu: T4\n"
        f"inputs:\n  data/: {{source: s3://my-datasets/corpus, mode: {mode}}}\nrun: ls data\n"
    )
    out = cli("render", str(job), "--agent-config", cwd=tmp_path, timeout=None, check=True)
    wanted = list(MOUNT_PACKAGES) if mode == "mount" else None
    assert json.loads(out.stdout)["stack"].get("mount_packages") == wanted
