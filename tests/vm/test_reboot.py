"""A cloud VM rebooted under the bootstrap (Azure's GPU driver extension may reboot it): the run
resumes, or ends in state error, reported, and the deadline backstop survives the reboot.

The guest is the real rendered bootstrap run by the VM simulator (tests/support/vm_sim.py) with
the stub tools; `reboot_guest` does what a reboot does to it: SIGTERM while systemd shows
reboot.target, SIGKILL, then the boot starts the units the guest enabled (not the user-data).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.azure_fixtures import arm, azure_env, azurite, fake_arm_server  # noqa: F401
from tests.support.azure_sim import AzureVmSimulator, azure_sim  # noqa: F401
from tests.support.cli import cli
from tests.support.fake_arm import FakeArm
from tests.support.render_inputs import T4
from tests.support.vm_boot import Vm, make_vm
from tests.support.vm_sim import Guest, GuestSimulator


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[GuestSimulator]:
    s = GuestSimulator(tmp_path / "sim")
    yield s
    s.stop()


def _wait(what: Callable[[], object], timeout: float = 30) -> object:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("timed out")


def _boot(sim: GuestSimulator, tmp: Path, name: str, *, hold_apt: bool = False, **kw: object) -> tuple[Vm, Guest]:
    vm = make_vm(tmp / name, provider="aws", stack=T4, gpu="T4", **kw)  # type: ignore[arg-type]
    state = sim.root / "vms" / name / "stub-state"
    state.mkdir(parents=True, exist_ok=True)
    if hold_apt:
        (state / "apt-hold").touch()
    env = {"GPUCLOUD_DEADLINE_GRACE": vm.env.get("GPUCLOUD_DEADLINE_GRACE", "30")}
    guest = sim.boot_guest(name, vm.script.read_text(), gpu="T4", gpu_count=1, env=env, name=name)
    assert guest is not None
    return vm, guest


def _final(vm: Vm) -> dict:
    def done() -> dict | None:
        s = vm.channel.read_status(vm.run_id, 0)
        return s if s and s["stage"] == "done" else None

    return _wait(done)  # type: ignore[return-value]


def test_reboot_mid_stack_resumes_and_runs_the_job_once(sim: GuestSimulator, tmp_path: Path) -> None:
    vm, guest = _boot(sim, tmp_path, "stack", hold_apt=True, run="echo first-line-of-the-job")
    hold = guest.sandbox / "stub-state" / "apt-hold"
    _wait(lambda: any(" install " in c for c in guest.stub_calls()))  # held inside the driver install
    sim.reboot_guest("stack", on_down=hold.unlink)
    status = _final(vm)
    assert status["state"] == "succeeded", status
    log = vm.log()
    assert "the machine is rebooting" in log and "the machine rebooted" in log
    assert vm.job_output().count("first-line-of-the-job") == 1
    timers = [c for c in guest.stub_calls() if c.startswith("systemd-run")]
    assert len(timers) == 2  # armed at the first boot and again after the reboot
    first, again = (int(c.split("--on-active=")[1].split("s")[0]) for c in timers)
    assert again <= first
    _wait(lambda: "shutdown -h now" in guest.stub_calls())


def test_reboot_mid_run_ends_the_run_reported(sim: GuestSimulator, tmp_path: Path) -> None:
    vm, guest = _boot(sim, tmp_path, "run", run="echo started; sleep 60")
    _wait(lambda: (s := vm.channel.read_status(vm.run_id, 0)) and s["stage"] == "run" and "started" in vm.log())
    sim.reboot_guest("run")
    status = _final(vm)
    assert status["state"] == "error" and "rebooted during stage run" in status["message"], status
    assert status["stages"]["run"]["ok"] is False
    _wait(lambda: "shutdown -h now" in guest.stub_calls())  # the machine ends itself


def test_deadline_that_passed_while_the_machine_was_down_ends_it(sim: GuestSimulator, tmp_path: Path) -> None:
    """The deadline passes while the machine is down, however long its first boot took: the node's
    recorded deadline (st/deadline, what a reboot re-arms from) is moved into the past while it is
    down, as the time passing there would have."""
    vm, guest = _boot(sim, tmp_path, "late", hold_apt=True, stub_env={"GPUCLOUD_DEADLINE_GRACE": "1"})
    hold = guest.sandbox / "stub-state" / "apt-hold"
    _wait(lambda: any(" install " in c for c in guest.stub_calls()))

    def down() -> None:
        hold.unlink()
        recorded = guest.sandbox / "vm" / "st" / "deadline"
        assert int(recorded.read_text()) > time.time() + 60  # the first boot was far from its deadline
        recorded.write_text(f"{int(time.time()) - 5}\n")

    sim.reboot_guest("late", on_down=down)
    status = _final(vm)
    assert status["state"] == "deadline", status
    timers = [c for c in guest.stub_calls() if c.startswith("systemd-run")]
    assert len(timers) == 2 and "--on-active=1s" in timers[1]  # re-armed from the recorded deadline
    _wait(lambda: "shutdown -h now" in guest.stub_calls())


def test_azure_grid_vm_rebooted_by_its_driver_extension_still_runs_the_job(
    azure_env: dict[str, str], arm: FakeArm, azure_sim: AzureVmSimulator, tmp_path: Path
) -> None:  # noqa: F811
    """End to end through the CLI: an NVadsA10 v5 VM whose NvidiaGpuDriverLinux extension (driverVersion
    pinned) reboots it while the bootstrap waits for the GRID driver; the run resumes and succeeds."""
    import json

    azure_sim.reboot_on_driver_extension = True
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: gridreboot\nresources:\n  cloud: azure\n  regions: [eastus]\n  gpu: A10:1\n"
        "stack: {framework: none}\nmax_duration: 15m\nrun: echo first-line-of-the-job\n"
    )
    out = cli("run", str(job), "--json", env=azure_env, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert json.loads(out.stdout)["status"] == "succeeded"
    assert len(azure_sim.rebooted) == 1
    (guest,) = azure_sim.guests.values()
    console = guest.console()
    assert "the machine is rebooting" in console and "the machine rebooted" in console
    assert "first-line-of-the-job" in out.stderr
    ext = [r for r in arm.calls if r[0] == "PUT" and "/extensions/" in r[1]]
    assert ext, "the driver extension was attached"


def test_a_kept_machine_rebooted_while_idle_comes_back_kept(sim: GuestSimulator, tmp_path: Path) -> None:
    """It waits again for its next job, its idle time counted from its job's end before the boot
    (not from the boot), and ends by it as a kept machine does; the job ran once."""
    vm, guest = _boot(sim, tmp_path, "kept", run="echo job-one", keep_s=8)
    first = _wait(lambda: (s := vm.channel.read_status(vm.run_id, 0)) and s.get("kept") and s)
    since = first["kept"]["since"]  # type: ignore[index]
    sim.reboot_guest("kept", down_s=0.5)
    _wait(lambda: "the machine rebooted while kept" in vm.log())
    assert f"it waits again for the next job (idle since {since})" in vm.log()
    status = _final(vm)
    assert status["state"] == "succeeded" and "the kept machine was idle for 8s: it ends" in status["message"], status
    assert vm.job_output().count("job-one") == 1
    _wait(lambda: "shutdown -h now" in guest.stub_calls())
