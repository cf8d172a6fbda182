"""How a run ends, whoever ends it: the final report (status, last log part, signature), the
provider's self-teardown, a signal, an unexpected end of the main thread, and a boot after a
reboot. Mixed into the Agent (agent.py), whose attributes are declared here.

Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Callable, Dict, Optional

from gpucloud.vm import protocol
from gpucloud.vm.agent import container, mounts
from gpucloud.vm.agent.claim import NodeKey
from gpucloud.vm.agent.config import JobConfig
from gpucloud.vm.agent.final import FinalGate
from gpucloud.vm.agent.heartbeat import Heartbeat
from gpucloud.vm.agent.hooks import Hooks
from gpucloud.vm.agent.logpump import LogPump
from gpucloud.vm.agent.runner import Runner
from gpucloud.vm.agent.status import StatusBoard
from gpucloud.vm.agent.transfer import Transfer

SIGNAL_WHY = "bootstrap stopped by a signal (teardown, spot interruption or shutdown)"


class StandDown(Exception):
    """Another part of the node took the final gate: this thread stops here."""


class EndedElsewhere(BaseException):
    """Raised in the main process (SIGUSR1) when its watchdog process took the end of the run: it
    unwinds whatever the main thread was doing, releasing the push lock the report needs."""


class AgentExit(Exception):
    """The main thread cannot go on (no manifest, no rank): the exit path reports what it can."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


class Ending:
    cfg: JobConfig
    vm_dir: Path
    environ: Dict[str, str]
    rank: int
    board: StatusBoard
    gate: FinalGate
    runner: Runner
    hooks: Hooks
    transfer: Transfer
    manifest: protocol.Manifest
    key: NodeKey
    pump: Optional[LogPump]
    heartbeat: Optional[Heartbeat]
    guard_stop: threading.Event
    watchdog_pid: int
    parent_pid: int
    _exit: Callable[[int], None]
    back_kept = False  # a kept machine's boot after a reboot while it waited (resume)

    def log(self, line: str) -> None:
        raise NotImplementedError

    def stop_pump(self) -> None:
        raise NotImplementedError

    def collect_artifacts(self) -> bool:
        raise NotImplementedError

    def _sign(self, raw: bytes) -> Optional[str]:
        raise NotImplementedError

    def finish(
        self, state: str, exit_code: Optional[int], script_code: int, message: str, terminate: bool = True
    ) -> None:
        """Report the end (the caller holds the final gate), then the provider's teardown."""
        if message:
            self.log(message)
        mounts.unmount_recorded(self.vm_dir, self.log)  # the job has ended: its mounted inputs go
        self.log(f"state {state}, exit code {'null' if exit_code is None else exit_code}")
        self.stop_pump()
        if self.heartbeat is not None:
            self.heartbeat.disk_check()
        parts = [message] if message else []
        if self.board.get("disk_full"):
            parts.append("the VM's disk was full: output may be incomplete")
        if self.board.get("art_failed"):
            parts.append(self.board.get("art_failed"))
        self.board.set_final(state, exit_code, "; ".join(parts))
        if self.pump is not None:
            self.pump.drain()
        if self.board.push(final=True):  # not delivered: the backstop may still report it
            try:
                (self.vm_dir / "st" / "reported").touch()  # the backstop reports a run whose reporter died first
            except OSError:
                pass
        self.guard_stop.set()
        try:
            (self.vm_dir / "st" / "script_code").write_text(str(script_code))
        except OSError:
            pass
        self._stop_watchdog()
        self.gate.finished(script_code)
        if terminate:
            self.terminate(script_code)

    def terminate(self, code: int) -> None:
        """The provider's self-teardown, then the process ends with `code`."""
        mounts.unmount_recorded(self.vm_dir, self.log)  # whoever ends here (the backstop) leaves no mount
        if self.cfg.self_termination != "exit":
            marker = self.vm_dir / "terminated"
            try:
                marker.mkdir()
            except OSError:
                self._exit(code)
                return
        self.hooks.end_machine(self._peers_running if self.cfg.num_nodes > 1 else None)
        self._kill_backstop()
        self.transfer.kill_all()  # a call another thread still waits on must not outlive the run
        self._exit(code)

    def _stop_watchdog(self) -> None:
        """The watchdog process stands down once the run was reported."""
        if self.watchdog_pid:
            try:
                os.kill(self.watchdog_pid, signal.SIGKILL)
                os.waitpid(self.watchdog_pid, 0)
            except OSError:
                pass
            self.watchdog_pid = 0

    def ended_elsewhere(self) -> None:
        """The watchdog process took the end (EndedElsewhere unwound this one, releasing its push
        lock): stop every call in flight, wait for that process to report, leave with its code."""
        self.transfer.kill_all()
        if self.watchdog_pid:
            try:
                os.waitpid(self.watchdog_pid, 0)
            except OSError:
                pass
        try:
            code = int((self.vm_dir / "st" / "script_code").read_text())
        except (OSError, ValueError):
            code = 124
        self._exit(code)

    def _peers_running(self) -> str:
        """Multi-node self-delete: publish `done`, then the ranks whose `done` is not there yet."""
        done = self.vm_dir / "done"
        done.write_text("done\n")
        url = self.manifest.url("done_put")
        if url and not self.transfer.put_file(url, done):
            self.log("could not publish that this node is done")
        missing = [
            str(r)
            for r in range(self.cfg.num_nodes)
            if r != self.rank and self.transfer.get(self.manifest.ranked_url("done_get", r), max_time=20) is None
        ]
        return "".join(f" {r}" for r in missing)

    def _kill_backstop(self) -> None:
        """The local backstop sleeper (a process group of its own) is disarmed by a normal end."""
        pid = self.environ.get("GPUCLOUD_BACKSTOP_PID", "")
        if self.cfg.self_termination != "exit" or not pid.isdigit():
            return
        try:
            os.killpg(int(pid), 15)
        except OSError:
            try:
                os.kill(int(pid), 15)
            except OSError:
                pass

    def take_final(self, who: str) -> None:
        if not self.gate.take(who):
            raise StandDown()

    def fail(self, message: str, exit_code: Optional[int] = None) -> None:
        """The run ends in error; `exit_code`: a documented code of its own (else the CLI's 70)."""
        self.take_final("main")
        self.runner.kill()
        self.finish("error", exit_code, exit_code or 1, message)
        raise StandDown()

    def on_signal(self) -> None:
        """SIGTERM/INT/HUP: the job stops once (5 s, then SIGKILL); its artifacts go up when it had
        started; the final status names the job's own exit code. A reboot is not an end."""
        if self.hooks.rebooting():
            self.gate.hold("reboot")
            self.log("the machine is rebooting: the run goes on after the boot")
            self.runner.kill()
            self._exit(143)
            return
        if not self.gate.take("signal"):
            self.runner.kill()
            if self.gate.owner == "elsewhere":
                self._exit(143)
            return
        pg = self.runner.pgid()
        rc = self.runner.kill()
        why = SIGNAL_WHY
        if pg is not None:
            if rc is not None:
                why += f"; the job exited with code {rc} after SIGTERM"
            self.artifacts_on_stop()
        self.finish("failed", None, 143, why)

    def artifacts_on_stop(self) -> None:
        """A job stopped before its end (a signal, the run's max_cost): what it saved goes up."""
        if self.cfg.artifacts and self.manifest.url("artifacts_put"):
            self.board.end_open(False)
            self.board.begin_stage("artifacts")
            self.log("stage artifacts")
            self.board.push()
            if not self.collect_artifacts():
                self.log("artifact upload failed")

    def on_unexpected_end(self, code: int, why: str) -> None:
        """Whatever ends the main thread early reports `error` if nobody did, then the teardown path."""
        if self.gate.take("exit"):
            self.runner.kill()
            self.finish("error", None, code, why)
            return
        if self.gate.elsewhere():  # the end was taken before (or by another process): just leave
            self.terminate(code)
            return
        self.gate.done.wait()
        self.terminate(self.gate.exit_code)

    def resume(self) -> Optional[int]:
        """A boot after a reboot: an ended run finishes its teardown; one whose job had started ends
        in `error` (a job is never started twice); one still setting up starts over."""
        self.log("the machine rebooted")
        container.remove_recorded(self.vm_dir)  # an engine may keep a container over a reboot
        mounts.unmount_recorded(self.vm_dir)  # the boot took the mounts; a run that starts over mounts again
        for name in ("job.pgid",):
            try:
                (self.vm_dir / name).unlink()
            except OSError:
                pass
        if self.gate.path.exists():
            try:
                (self.vm_dir / "terminated").rmdir()
            except OSError:
                pass
            return 0
        stages = self.board.get("stages") or {}
        why = (
            f"the machine rebooted during stage {self.board.get('stage')}: the job's "
            "processes were lost, so the run ends here (a job is never started twice)"
        )
        if self.board.get("kept") and self.board.get("state") in protocol.FINAL_STATES:
            if not self.cfg.container:
                self.back_kept = True  # it waited for its next job: it waits again (keep.py `rejoin_keep`)
                return None
            why = "the kept machine rebooted: its job's container went with the boot, so it ends here"
        if any(s in stages for s in ("setup", "barrier", "run")):
            self.manifest = protocol.parse_manifest((self.vm_dir / "manifest").read_text(errors="replace"))
            self.board.sign = self._sign if self.manifest.signs else None
            self.key.reuse()
            self.take_final("resume")
            self.finish("error", None, 1, why)
            return 1
        return None
