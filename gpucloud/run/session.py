"""`gpucloud ssh RUN`: a shell or one command on a running node, its ports forwarded to the caller.

The run's record names its provider and its launched attempt's handle; the provider answers how to
reach node N (`Provider.session_path`, gpucloud/contract/session.py) and this module runs that in the
caller's terminal and says which local URL serves each forwarded port. Every forward listens on
the caller's loopback only. `--write-config` keeps the `ssh_config` entries `gpucloud-RUN` and
`gpucloud-RUN-N` in a file of gpucloud's own under GPUCLOUD_HOME (docs/SSH.md).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from gpucloud.contract import registry as providers
from gpucloud.contract.provider import RunHandle
from gpucloud.contract.session import MAX_FORWARDS, Forward, SessionAsk, SessionPlan
from gpucloud.errors import UserError
from gpucloud.prose import to_stderr
from gpucloud.run.ssh_entries import config_entries
from gpucloud.state.records import RunRecord

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class SessionRequest:
    """What the command line asked for."""

    run_ref: str
    node: int = 0
    command: tuple[str, ...] = ()
    forwards: tuple[str, ...] = ()  # -L values: PORT or LOCAL:PORT
    forward_only: bool = False
    print_config: bool = False
    write_config: bool = False


def parse_forward(text: str, *, where: str = "-L") -> Forward:
    """`8888` (the same port here) or `9000:8888` (local 9000 to the node's 8888); nothing else:
    a bind address would let the forward listen beyond this machine's loopback."""
    parts = text.split(":")
    if len(parts) not in (1, 2) or not all(p.isascii() and p.isdigit() and 0 < int(p) < 65536 for p in parts):
        raise UserError(
            f"{where} {text!r} is not a port forward.",
            hint="Write PORT (e.g. -L 8888) or LOCAL:PORT (e.g. -L 9000:8888); the forward listens on 127.0.0.1 only.",
        )
    return Forward(local=int(parts[0]), remote=int(parts[-1]))


def job_ports(run: RunRecord) -> list[int]:
    """The job file's `ports` (kept in the run's record)."""
    try:
        ports = (json.loads(run.spec_json or "{}") or {}).get("ports") or []
    except ValueError:
        return []
    return [int(p) for p in ports if isinstance(p, int) and not isinstance(p, bool)]


def free_local(port: int) -> int:
    """`port` when it is free on this machine's loopback, else one the kernel picks."""
    for want in (port, 0):
        with socket.socket() as sock:
            try:
                sock.bind((LOOPBACK, want))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise UserError(f"no free local port for the node's port {port}.")


def forwards_for(req: SessionRequest, run: RunRecord) -> tuple[Forward, ...]:
    """-L forwards first, then the job's `ports` not already named; a port of the job whose number
    is taken here gets a free local port instead (the URL says which)."""
    asked = [parse_forward(text) for text in req.forwards]
    named = {f.remote for f in asked}
    extra = [Forward(local=free_local(p), remote=p) for p in job_ports(run) if p not in named]
    found = tuple(dict.fromkeys([*asked, *extra]))
    if len(found) > MAX_FORWARDS:
        raise UserError(f"{len(found)} ports to forward; one session forwards at most {MAX_FORWARDS}.")
    return found


def session_target(store: object, run: RunRecord, node: int) -> RunHandle:
    """The running run's handle, or the error that says why there is no node to reach."""
    if run.final:
        raise UserError(
            f"run {run.id} is {run.status}: its machines are gone, there is nothing to open a session on.",
            hint="`gpucloud ls` lists the runs; a session needs one that is running.",
        )
    launched = [a for a in run.attempts if a.launched and a.handle_json]
    if not launched:
        raise UserError(
            f"run {run.id} is {run.status} and has no machine yet.",
            hint="Try again once `gpucloud status` shows it running.",
        )
    handle = RunHandle.from_json(launched[-1].handle_json or "")
    count = max(run.num_nodes, len(handle.nodes), 1)
    if not 0 <= node < count:
        raise UserError(f"--node {node}: run {run.id} has node(s) 0..{count - 1}.")
    return handle


def open_session(req: SessionRequest) -> int:
    """Look the run up, ask its provider the way in, then print the entries or run the session."""
    from gpucloud.run.commands import refresh, require_run
    from gpucloud.state.runs_db import Store

    store = Store()
    run = refresh(store, require_run(store, req.run_ref))
    handle = session_target(store, run, req.node)
    provider = providers.get_provider(handle.cloud)
    tty = not req.command and not req.forward_only and sys.stdin.isatty()
    forwards = forwards_for(req, run)
    ask = SessionAsk(command=req.command, tty=tty, forwards=forwards, forward_only=req.forward_only)
    plan = provider.session_path(handle, req.node, ask)
    if req.print_config or req.write_config:
        return config_entries(run, handle, provider, write=req.write_config)
    store.event(run.id, "session", f"gpucloud ssh to node {req.node}" + (" (a command)" if req.command else ""))
    return run_plan(plan, announce=lambda: say_forwards(run, req.node, forwards, plan))


def say_forwards(run: RunRecord, node: int, forwards: tuple[Forward, ...], plan: SessionPlan) -> None:
    """One stderr line per forwarded port with the URL that serves it here."""
    for fwd in forwards:
        port = fwd.remote if plan.ports_local else fwd.local
        how = "the node's own port on this machine" if plan.ports_local else "forwarded over the session"
        to_stderr(f"run {run.id} node {node}: port {fwd.remote} -> http://{LOOPBACK}:{port}/ ({how})")


def run_plan(plan: SessionPlan, announce: Callable[[], None] = lambda: None) -> int:
    """Run the session in this terminal and return its exit code. Ctrl-C reaches the session
    itself (same terminal); a TERM or HUP to gpucloud ends the session too, so no forward outlives it.
    The handlers are in place before `announce` (the URL lines a caller acts on) and before the
    session starts: a TERM at any moment after those lines ends gpucloud with 143, never by default."""
    procs: list[subprocess.Popen[bytes]] = []
    stopped: list[int] = []

    def stop(signum: int, _frame: FrameType | None) -> None:
        stopped.append(signum)
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = 0
    try:
        announce()
        if not stopped:
            procs.append(subprocess.Popen(plan.argv, cwd=plan.cwd, env=plan.env))
            if stopped:  # told to stop while the session was starting
                procs[0].terminate()
            code = procs[0].wait()
    finally:
        signal.signal(signal.SIGINT, old_int)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stopped:  # the session ended because gpucloud was told to end: say so, as a shell would
        return 128 + stopped[0]
    return 128 - code if code < 0 else code
