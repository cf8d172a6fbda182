"""The job's steps (setup, run): each in its own session and process group, output appended to
job.log, its group id in job.pgid so every other part of the node (watchdog, guard, signal, the
backstop process) can stop it: SIGTERM, then SIGKILL after a grace. A step in a container also has
its container recorded (container.py), removed after the step and after every kill: a killed
engine client leaves its container running. Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Callable, Mapping, Optional, Tuple

from gpucloud.vm.agent import container

KILL_GRACE_S = 5.0
KILL_POLL_S = 0.05
KILL_SETTLE_S = 1.0  # after SIGKILL: time for the killed processes to be gone
ENDED_STATES = (b"Z", b"X")  # /proc/PID/stat: zombie, dead


class Runner:
    def __init__(
        self, vm_dir: Path, job_dir: Path, log_path: Path, log: Callable[[str], None], sleep: Callable[[float], None]
    ) -> None:
        self.vm_dir = vm_dir
        self.pgid_path = vm_dir / "job.pgid"
        self.job_dir = job_dir
        self.log_path = log_path
        self.log = log
        self.sleep = sleep
        self.proc: Optional[subprocess.Popen] = None
        self.lock = threading.Lock()

    def start(self, command: str, env: Mapping[str, str]) -> subprocess.Popen:
        with open(self.log_path, "ab") as out:
            proc = subprocess.Popen(
                ["bash", "-c", command],
                cwd=str(self.job_dir),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        with self.lock:
            self.proc = proc
        self.pgid_path.write_text(f"{proc.pid}\n")
        return proc

    def run(self, command: str, env: Mapping[str, str], box: Optional[Tuple[str, str]] = None) -> int:
        """Run one step to its end; its leftovers (background children) get SIGTERM after, SIGKILL
        if they outlast the grace, and are waited for: nothing of a step outlives it. `box` (engine,
        container name), the container the step runs in, is removed."""
        if box is not None:
            container.record(self.vm_dir, *box)
        proc = self.start(command, env)
        rc = shell_code(proc.wait())
        self._end_group(proc.pid, KILL_GRACE_S, "a background process of the step")
        if box is not None:
            container.remove_recorded(self.vm_dir)
        try:
            self.pgid_path.unlink()
        except OSError:
            pass
        return rc

    def pgid(self) -> Optional[int]:
        try:
            return int(self.pgid_path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill(self, grace: float = KILL_GRACE_S) -> Optional[int]:
        """SIGTERM to the job's group, SIGKILL after `grace` s, then its container removed; the
        job's exit code when it was ours. A container's engine client passes the SIGTERM on."""
        try:
            return self._kill(grace)
        finally:
            container.remove_recorded(self.vm_dir)

    def _kill(self, grace: float) -> Optional[int]:
        pg = self.pgid()
        if pg is not None:
            self._end_group(pg, grace, "job")
        return self._code()

    def _end_group(self, pg: int, grace: float, who: str) -> None:
        """SIGTERM to the group; SIGKILL to what still runs after `grace` s."""
        if not _signal_group(pg, signal.SIGTERM) or self._gone_within(pg, grace):
            return
        self.log(f"{who} ignored SIGTERM for {int(grace)} s: SIGKILL")
        _signal_group(pg, signal.SIGKILL)
        self._gone_within(pg, KILL_SETTLE_S)  # SIGKILL cannot be refused, only be slow

    def _gone_within(self, pg: int, seconds: float) -> bool:
        """Whether the group has no running process left within `seconds` (polled)."""
        waited = 0.0
        while True:
            self._reap()
            if not _alive(pg):
                return True
            if waited >= seconds:
                return False
            self.sleep(KILL_POLL_S)
            waited += KILL_POLL_S

    def _reap(self) -> None:
        """Collect our own exited job: a zombie still counts as a member of its process group."""
        with self.lock:
            proc = self.proc
        if proc is not None:
            proc.poll()

    def _code(self) -> Optional[int]:
        with self.lock:
            proc = self.proc
        if proc is None:
            return None
        try:
            return shell_code(proc.wait(timeout=10))
        except subprocess.TimeoutExpired:
            return None


def shell_code(rc: int) -> int:
    """A job ended by signal N reports 128 + N, as a shell's `wait` does (Popen says -N)."""
    return 128 - rc if rc < 0 else rc


def _signal_group(pg: int, sig: int) -> bool:
    try:
        os.killpg(pg, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _alive(pg: int) -> bool:
    """Whether a process of the group still runs. A zombie has ended: the watchdog process cannot
    reap the job (the main process started it, and waits for the watchdog), so counting the job's
    zombie would wait out the grace and say a job that obeyed SIGTERM ignored it. The group is
    scanned only once its leader (the job's shell) is a zombie or already reaped; where /proc
    cannot tell, the kernel's answer stands."""
    if not _signal_group(pg, 0):
        return False
    leader = _stat(str(pg))
    if leader is not None and leader[1] == pg and leader[0] not in ENDED_STATES:
        return True
    try:
        names = os.listdir("/proc")
    except OSError:
        return True
    for name in names:
        got = _stat(name) if name.isdigit() else None
        if got is not None and got[1] == pg and got[0] not in ENDED_STATES:
            return True
    return False


def _stat(pid: str) -> Optional[Tuple[bytes, int]]:
    """(state, process group) of a process from /proc, or None."""
    try:
        with open("/proc/" + pid + "/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) ": comm may hold spaces
    if len(fields) > 2 and fields[2].isdigit():
        return fields[0], int(fields[2])
    return None
