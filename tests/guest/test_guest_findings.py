"""What the real guest showed about the node side, held without booting one (these run everywhere).

A real `systemctl reboot` ends cloud-final.service (KillMode=process, the unit that runs the
user-data and so the agent) by SIGTERM to cloud-init alone; the agent gets its SIGTERM later, from
systemd-shutdown as PID 1, when `systemctl list-jobs` answers nothing. The agent must still read that
as a reboot (tests/guest/test_guest_faults.py shows the whole run on the guest)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucloud.vm.agent import hooks
from gpucloud.vm.agent.transfer import Transfer


def _hooks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pid1: bytes) -> hooks.ShutdownHooks:
    cmdline = tmp_path / "cmdline"
    cmdline.write_bytes(pid1)
    monkeypatch.setattr(hooks, "PID1_CMDLINE", str(cmdline))
    monkeypatch.setenv("PATH", str(tmp_path))  # no systemctl: as under systemd-shutdown, no answer
    return hooks.ShutdownHooks(Transfer(), {}, lambda line: None, lambda s: None)


def test_sigterm_from_systemd_shutdown_rebooting_is_a_reboot(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pid1 = b"/usr/lib/systemd/systemd-shutdown\0reboot\0--timeout\x0090000000us\0--log-level\0info\0"
    assert _hooks(monkeypatch, tmp_path, pid1).rebooting()


@pytest.mark.parametrize(
    "pid1", [b"/usr/lib/systemd/systemd-shutdown\0poweroff\0", b"/sbin/init\0", b"/lib/systemd/systemd\0reboot\0"]
)
def test_a_poweroff_or_a_running_system_is_no_reboot(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pid1: bytes
) -> None:
    assert not _hooks(monkeypatch, tmp_path, pid1).rebooting()
