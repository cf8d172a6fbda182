"""A new machine booted from a used disk (an image made from a machine that ran a run, a volume
moved to a new instance): the disk holds that run's work folder and its enabled resume unit. The
new machine must not resume (or end itself for) a run that was another machine's; it runs its own
user-data's run, or nothing. A reboot of the run's own machine still resumes.

The machine's marks (SMBIOS UUID, cloud-init's instance id, its user-data) come from the folder
GPUCLOUD_MACHINE_ROOT names, which stands in for / here (gpucloud/vm/agent/owner.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucloud.vm.agent import owner
from tests.support.polling import wait_until
from tests.support.render_inputs import T4
from tests.support.vm_boot import Vm, make_vm
from tests.support.vm_sim import SHUTDOWN_MARKER, Guest, GuestSimulator


def _machine(root: Path, uuid: str, instance: str, user_data: bytes = b"#!/bin/sh\n") -> Path:
    """What / shows of one machine: its SMBIOS UUID, cloud-init's instance id and user-data."""
    for rel, data in (
        (owner.MARK_FILES[0][1], uuid.encode() + b"\n"),
        (owner.MARK_FILES[2][1], instance.encode() + b"\n"),
        (owner.USER_DATA, user_data),
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def _used_folder(tmp: Path, run_id: str, machine: Path) -> tuple[Path, Path]:
    """W as a finished run of `machine` left it, and the systemd folder with its enabled unit."""
    w, units = tmp / "w", tmp / "etc" / "systemd" / "system"
    (w / "agent").mkdir(parents=True)
    (w / "st").mkdir()
    (w / "st" / "deadline").write_text("1\n")
    (w / "final").mkdir()
    (w / "boot.sh").write_text("#!/bin/sh\n")
    (units / "multi-user.target.wants").mkdir(parents=True)
    (units / owner.UNIT).write_text("[Unit]\n")
    (units / "multi-user.target.wants" / owner.UNIT).symlink_to(units / owner.UNIT)
    owner.record(w, run_id, {"GPUCLOUD_MACHINE_ROOT": str(machine)})
    return w, units


def test_a_reboot_of_the_runs_own_machine_resumes(tmp_path: Path) -> None:
    a = _machine(tmp_path / "a", "ec2e1916-aaaa", "i-0aaa")
    w, units = _used_folder(tmp_path, "r1", a)
    assert owner.resume_here(w, "r1", {"GPUCLOUD_MACHINE_ROOT": str(a), "GPUCLOUD_ETC": str(tmp_path / "etc")}, print)
    assert (w / "final").is_dir() and (units / owner.UNIT).is_file()


@pytest.mark.parametrize(
    "other",
    [
        ("ec2e1916-bbbb", "i-0aaa", b"#!/bin/sh\n"),  # another SMBIOS UUID (EC2 instance, Azure VM id)
        ("ec2e1916-aaaa", "i-0bbb", b"#!/bin/sh\n"),  # another instance id (cloud-init's)
        ("ec2e1916-aaaa", "i-0aaa", b""),  # another user-data (here: none)
    ],
)
def test_a_new_machine_on_the_used_disk_does_not_resume_and_sets_the_old_run_aside(
    tmp_path: Path, other: tuple[str, str, bytes]
) -> None:
    a = _machine(tmp_path / "a", "ec2e1916-aaaa", "i-0aaa")
    b = _machine(tmp_path / "b", *other)
    w, units = _used_folder(tmp_path, "r1", a)
    said: list[str] = []
    env = {"GPUCLOUD_MACHINE_ROOT": str(b), "GPUCLOUD_ETC": str(tmp_path / "etc")}
    assert not owner.resume_here(w, "r1", env, said.append)
    assert sorted(p.name for p in w.iterdir()) == ["agent", "earlier"], said
    (kept,) = (w / "earlier").iterdir()
    assert kept.name.startswith("r1.") and (kept / "final").is_dir() and (kept / "st" / "owner").is_file()
    assert not (units / owner.UNIT).exists() and not (units / "multi-user.target.wants" / owner.UNIT).exists()
    assert "differs" in said[0]
    # this machine's own user-data starts its run in a clean folder, recorded as W's owner
    assert owner.take_over(w, "r2", env) == (False, [])
    assert json.loads((w / "st" / "owner").read_text())["run_id"] == "r2"
    # the old unit firing late (it raced the new run) leaves the new run alone
    assert not owner.resume_here(w, "r1", env, said.append)
    assert "holds run r2" in said[-1] and (w / "st" / "owner").is_file()


def test_a_new_run_sets_aside_what_another_run_left_and_the_same_run_resumes(tmp_path: Path) -> None:
    a = _machine(tmp_path / "a", "ec2e1916-aaaa", "i-0aaa")
    w, _ = _used_folder(tmp_path, "r1", a)
    rebooted, said = owner.take_over(w, "r2", {"GPUCLOUD_MACHINE_ROOT": str(a)})
    assert not rebooted and "held another run (r1)" in said[0]
    assert not (w / "final").exists() and not (w / "boot.sh").exists()
    # cloud-init running the same user-data again on the same machine: a resume, never a second job
    assert owner.take_over(w, "r2", {"GPUCLOUD_MACHINE_ROOT": str(a)})[0]


def test_a_fresh_folder_and_the_running_shim_stay_in_place(tmp_path: Path) -> None:
    """A work folder no run used yet (the shim's own script may sit in it, as on the local
    simulator) is nobody's earlier run; a later run's files go, the shim running now stays."""
    w = tmp_path / "w"
    (w / "agent").mkdir(parents=True)
    (w / "bootstrap.sh").write_text("#!/bin/sh\n")
    assert owner.take_over(w, "r1", {}) == (False, [])
    assert (w / "bootstrap.sh").is_file() and not (w / owner.EARLIER).exists()
    (w / "job.log").write_text("r1's log\n")
    rebooted, said = owner.take_over(w, "r2", {"GPUCLOUD_SHIM": str(w / "bootstrap.sh")})
    assert not rebooted and "held another run (r1)" in said[0]
    assert (w / "bootstrap.sh").is_file() and not (w / "job.log").exists()


# ---- the whole node (the rendered shim, the agent, the stub tools) on the guest simulator ----------


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[GuestSimulator]:
    s = GuestSimulator(tmp_path / "sim")
    yield s
    s.stop()


def _final(vm: Vm) -> dict:
    """The run's final status (its `done` stage), within 30 s."""
    got: list[dict] = []

    def done() -> bool:
        s = vm.channel.read_status(vm.run_id, 0)
        got[:] = [s] if s and s["stage"] == "done" else []
        return bool(got)

    assert wait_until(done, 30, 0.05), vm.log()[-2000:]
    return got[0]


def _boot(sim: GuestSimulator, tmp: Path, vm_id: str, machine: Path, run: str) -> tuple[Vm, Guest]:
    vm = make_vm(tmp / vm_id, provider="aws", stack=T4, gpu="T4", run=run)
    env = {"GPUCLOUD_DEADLINE_GRACE": "30", "GPUCLOUD_MACHINE_ROOT": str(machine)}
    guest = sim.boot_guest(vm_id, vm.script.read_text(), gpu="T4", gpu_count=1, env=env, name="disk")
    assert guest is not None
    return vm, guest


@pytest.mark.parametrize("user_data", [True, False])
def test_a_new_machine_from_a_used_disk_runs_its_own_user_data_or_nothing(
    sim: GuestSimulator, tmp_path: Path, user_data: bool
) -> None:
    a = _machine(tmp_path / "a", "ec2e1916-aaaa", "i-0aaa")
    first, guest = _boot(sim, tmp_path, "i-0aaa", a, "echo first-run")
    assert _final(first)["state"] == "succeeded"
    assert wait_until(lambda: "shutdown -h now" in guest.stub_calls(), 30, 0.05)
    sim.wait_idle()
    before = first.channel.read_status(first.run_id, 0)
    calls = len(guest.stub_calls())
    # the disk boots as another instance: its enabled units start (and its user-data, if any)
    (guest.sandbox / SHUTDOWN_MARKER).unlink()
    b = _machine(tmp_path / "b", "ec2e1916-bbbb", "i-0bbb", b"new user-data" if user_data else b"")
    assert guest.vm.env is not None
    guest.vm.env["GPUCLOUD_MACHINE_ROOT"] = str(b)
    sim.reboot_guest("i-0aaa")
    if user_data:
        second, _ = _boot(sim, tmp_path, "i-0bbb", b, "echo second-run")
        status = _final(second)
        assert status["state"] == "succeeded", (status, second.log()[-2000:])
        assert "second-run" in second.job_output() and "first-run" not in second.job_output()
    assert sim.wait_idle(30)
    new_calls = guest.stub_calls()[calls:]
    if not user_data:  # nothing armed, nothing ended: the machine is its launcher's, idle
        assert not [c for c in new_calls if c.startswith(("systemd-run", "shutdown"))], new_calls
    assert first.channel.read_status(first.run_id, 0) == before  # the old run's channel untouched
    assert first.job_output().count("first-run") == 1
    (kept,) = (guest.sandbox / "vm" / "earlier").iterdir()
    assert kept.name.startswith(first.run_id + ".")
