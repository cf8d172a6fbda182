"""`python3 -m gpucloud.vm.agent MODE W CONFIG [MANIFEST_URL [RANK]]`, started by the shim:

    run       a node's first boot: the whole run (agent.py)
    resume    a boot after a reboot (the boot unit runs the shim, which runs this)
    backstop  deadline layer (a) firing: report `deadline` if nobody did, then end the machine
    mine      `mine W RUN_ID`, before a resume re-arms anything: exit 0 when W holds this machine's
              own run RUN_ID (a reboot), 1 when that run was another machine's (owner.py)

Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import List

from gpucloud.vm.agent import container, owner, private
from gpucloud.vm.agent.agent import Agent
from gpucloud.vm.agent.config import JobConfig
from gpucloud.vm.agent.deadline import Deadline
from gpucloud.vm.agent.ending import AgentExit, EndedElsewhere, StandDown

BACKSTOP_MESSAGE = "max_duration passed and the bootstrap did not end in time: stopped by the backstop"


def _install_signals(agent: Agent) -> None:
    once = threading.Lock()

    def handler(signum: int, frame: object) -> None:
        if once.acquire(blocking=False):
            # At once, in the main thread: whatever it was waiting on (the job, apt) ends with the
            # signal too, and it must not report that end before on_signal has decided.
            agent.gate.hold("signal")
            threading.Thread(target=_guarded_signal, args=(agent,), daemon=True, name="signal").start()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, handler)
    # The watchdog process took the end of the run: unwind the main thread (once).
    signal.signal(signal.SIGUSR1, _ended_elsewhere)


def _ended_elsewhere(signum: int, frame: object) -> None:
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    raise EndedElsewhere()


def _guarded_signal(agent: Agent) -> None:
    try:
        agent.on_signal()
    except StandDown:
        pass


def run(agent: Agent, resumed: bool) -> None:
    _install_signals(agent)
    try:
        _run(agent, resumed)
    except EndedElsewhere:
        agent.ended_elsewhere()


def _run(agent: Agent, resumed: bool) -> None:
    try:
        if resumed:
            agent.make_dirs()
            agent.board.load()
            code = agent.resume()
            if code is not None:
                agent.terminate(code)
                return
        code = agent.main()
        agent.terminate(code)
    except StandDown:
        if agent.gate.elsewhere():
            agent.ended_elsewhere()
        agent.gate.done.wait()
        agent.terminate(agent.gate.exit_code)
    except AgentExit as exc:
        agent.log(str(exc))
        agent.on_unexpected_end(exc.code, f"the bootstrap ended unexpectedly (exit {exc.code})")
    except Exception as exc:  # noqa: BLE001 - any end of the main thread is reported, then torn down
        agent.on_unexpected_end(1, f"the bootstrap ended unexpectedly ({exc.__class__.__name__}: {exc})")


def backstop(agent: Agent) -> None:
    """Layer (a): the shim's sleeper already killed the node's process groups (local)."""
    agent.log(f"backstop: max_duration + {agent.cfg.grace}s passed and the bootstrap did not end this machine")
    container.remove_recorded(agent.vm_dir)  # the job's container outlives its killed engine client
    manifest_path = agent.vm_dir / "manifest"
    if agent.st.is_dir() and manifest_path.is_file() and _report_here(agent):
        agent.load_from_disk()
        if agent.manifest.signs and not agent.key.reuse():
            agent.key.done.set()
        agent.board.end_open(False)
        agent.board.set_final("deadline", None, BACKSTOP_MESSAGE)
        if agent.pump is not None:
            agent.pump.drain()
        if agent.board.push(final=True):
            (agent.st / "reported").touch()
    try:
        (agent.vm_dir / "terminated").rmdir()  # an earlier teardown that did not end the machine: again
    except OSError:
        pass
    agent.terminate(124)


def _report_here(agent: Agent) -> bool:
    """The backstop reports when nobody took the end, or when whoever took it died before its
    final status went up (the watchdog process killed in the middle of its report)."""
    if agent.gate.take("backstop"):
        return True
    if agent.cfg.self_termination == "exit":  # the shim's sleeper killed that process itself
        return False
    if (agent.st / "reported").exists() or not agent.gate.owner_gone():
        return False
    agent.log("backstop: the process that was ending the run is gone before it reported")
    return True


def mine(vm_dir: Path, run_id: str) -> int:
    """The resume unit's first step: 1 when W's run is not this machine's; else 0, printing the
    seconds left until the run's backstop (at least 1: a deadline that passed while the machine
    was down ends the run at once)."""
    if not owner.resume_here(vm_dir, run_id, dict(os.environ), _console):
        return 1
    grace = os.environ.get("GPUCLOUD_DEADLINE_GRACE", "")
    if not grace.isdigit():
        try:
            grace = str(JobConfig.load(vm_dir / "agent" / "job.json").grace)
        except Exception:  # noqa: BLE001 - an unreadable config: the least grace, never no backstop
            grace = "0"
    deadline = Deadline.load(vm_dir / "st")
    left = (deadline.at if deadline else 0) + int(grace) - int(time.time())
    sys.stdout.write(f"{max(1, left)}\n")
    return 0


def _console(line: str) -> None:
    sys.stderr.write(f"[gpucloud] {line}\n")


def _take_over(agent: Agent) -> bool:
    """A machine's first run of its user-data: whatever another machine's run left on this disk
    is set aside first. True when W holds this very run already (it resumes instead)."""
    try:
        rebooted, lines = owner.take_over(agent.vm_dir, agent.cfg.run_id, agent.environ)
    except OSError as exc:
        rebooted, lines = False, [f"cannot check whose run the work folder holds: {exc}"]
    for line in lines:
        agent.log(line)
    return rebooted


def main(argv: List[str]) -> int:
    # On a shared SSH host or Slurm cluster, the node's folder (its key, the manifest's grants, the
    # code, inputs, logs, artifacts) must not be readable by the host's other users.
    os.umask(private.UMASK)
    if len(argv) == 3 and argv[0] == "mine":
        return mine(Path(argv[1]), argv[2])
    if len(argv) < 3 or argv[0] not in ("run", "resume", "backstop"):
        sys.stderr.write("usage: python3 -m gpucloud.vm.agent run|resume|backstop W CONFIG [MANIFEST_URL [RANK]]\n")
        return 2
    mode, vm_dir, config = argv[0], Path(argv[1]), Path(argv[2])
    cfg = JobConfig.load(config)
    rank = argv[4] if len(argv) > 4 else ""
    if rank.isdigit():
        cfg.rank = int(rank)
    agent = Agent(cfg, vm_dir, manifest_url=argv[3] if len(argv) > 3 else "", resumed=mode == "resume")
    if mode == "run" and agent.hooks.reboot_safe:
        agent.resumed = _take_over(agent)
    if mode == "backstop":
        backstop(agent)
    else:
        run(agent, agent.resumed)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
