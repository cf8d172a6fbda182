"""The resume unit a cloud VM's agent writes: its paths reach systemd as one argument each, whatever
they hold (a space, a `%`, a quote), and a path with a line break writes no unit at all."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpucloud.vm.agent import hooks
from tests.support.vm_sim import boot_services


def _hooks(etc: Path, monkeypatch: pytest.MonkeyPatch) -> hooks.ShutdownHooks:
    done = subprocess.CompletedProcess[str]([], 0)
    monkeypatch.setattr(hooks.subprocess, "run", lambda *a, **k: done)  # systemctl: nothing to reload here
    return hooks.ShutdownHooks(None, {"GPUCLOUD_ETC": str(etc)}, print, lambda s: None)  # type: ignore[arg-type]


def _enable(etc: Path) -> None:
    """What `systemctl enable` does for a unit WantedBy=multi-user.target."""
    wants = etc / "systemd" / "system" / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / "gpucloud-resume.service").symlink_to(etc / "systemd" / "system" / "gpucloud-resume.service")


@pytest.mark.parametrize("name", ["plain", "with space", "100%d", 'quo"te', "back\\slash"])
def test_the_resume_unit_hands_systemd_each_path_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    vm_dir = tmp_path / name
    vm_dir.mkdir()
    shim = tmp_path / "shim.sh"
    shim.write_text("#!/bin/sh\n")
    etc = tmp_path / "etc"
    assert _hooks(etc, monkeypatch).boot_unit(vm_dir, shim, "run-20261207-0001")
    _enable(etc)
    assert boot_services(etc) == [["/bin/sh", str(vm_dir / "boot.sh"), "resume", str(vm_dir)]]


def test_a_folder_with_a_line_break_writes_no_unit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vm_dir = tmp_path / "a\n[Service]\nExecStartPre=-rm -rf ~"
    vm_dir.mkdir()
    shim = tmp_path / "shim.sh"
    shim.write_text("#!/bin/sh\n")
    etc = tmp_path / "etc"
    assert not _hooks(etc, monkeypatch).boot_unit(vm_dir, shim, "run-20261207-0001")
    assert not (etc / "systemd").exists()
