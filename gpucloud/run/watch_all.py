"""`gpucloud watch --all`: one long-lived process (a systemd service, a container) that follows every
detached run in the (shared) state store, so spot recovery, the collection of results and the
teardown need no laptop kept open; and that runs `gc` on a schedule.

Each run is followed by a `gpucloud watch RUN` child (run/lifecycle.py `watch_job`: the same
recovery per the run's policy, collection and teardown as a following `run`), started only under
the run's lease (state/leases.py) and killed (SIGKILL: a child is never asked to tear anything
down) when the lease is lost or the watcher ends. Several watchers may run at once: a run's lease
is held by one of them, renewed every tick, and taken over by another once it expires. A watcher
killed at any point loses its children with it (PR_SET_PDEATHSIG), and the next watcher resumes
each run from the store (its attempts and journal say what the killed one had done); nothing is
held in memory that the store does not have.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from gpucloud.prose import to_stderr
from gpucloud.state.leases import GC_LEASE, Leases
from gpucloud.state.runs_db import RunRecord, Store, home_dir

POLL_S = 5.0
LEASE_S = 60.0
GC_EVERY_S = 3600.0
RETRY_S = 30.0  # a run whose child ended without finishing it is not taken again before this
PR_SET_PDEATHSIG = 1
FRESH_S = 600.0  # a run this young whose launching CLI still lives on this host is left to that CLI


def cli_argv() -> list[str]:
    """How this CLI was started, without its arguments (`python -m gpucloud`, the console script, or
    a launcher that wraps the CLI), so that children are the same program."""
    orig = list(getattr(sys, "orig_argv", []))
    if orig and len(orig) >= len(sys.argv):
        return orig[: len(orig) - len(sys.argv) + 1]
    return [sys.executable, "-m", "gpucloud"]


def _die_with_parent() -> None:
    """In the child, before exec: the kernel SIGKILLs it when the watcher dies, however it dies."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class Watcher:
    """One `watch --all` process; `tick()` does one round, `loop()` ticks until told to stop."""

    poll_s: float = POLL_S
    lease_s: float = LEASE_S
    gc_every_s: float = GC_EVERY_S
    holder: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}")
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    retry_at: dict[str, float] = field(default_factory=dict)
    downs: set[str] = field(default_factory=set)  # runs this watcher is taking down for a budget
    stopping: bool = False

    def __post_init__(self) -> None:
        self.store = Store()
        self.leases = Leases(self.store)
        self.logs = home_dir() / "watch"
        self.logs.mkdir(mode=0o700, exist_ok=True)
        self.gc_proc: subprocess.Popen[bytes] | None = None

    def loop(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: setattr(self, "stopping", True))
        to_stderr(f"watching every detached run in {self.store.location} as {self.holder}")
        while not self.stopping:
            self.tick()
            deadline = time.monotonic() + self.poll_s
            while not self.stopping and time.monotonic() < deadline:
                time.sleep(0.2)
        self.stop()
        return 0

    def tick(self) -> None:
        self._reap()
        self._renew()
        if not self.stopping:
            self._enforce_budgets()
            self._adopt()
            self._gc_if_due()

    def stop(self) -> None:
        """Followers killed, their leases let go at once so another watcher need not wait for expiry.
        A child whose run is already final is tearing it down or collecting its results: it is
        waited for (stopped halfway, it would leave machines up), and its lease row dropped."""
        for run_id, proc in list(self.children.items()):
            if run_id not in self.downs and not self._final(run_id):
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            proc.wait()
            self.leases.release(run_id, self.holder, done=self._final(run_id))
        self.children.clear()

    def _final(self, run_id: str) -> bool:
        run = self.store.get_run(run_id)
        return run is None or run.final

    # -- one round ------------------------------------------------------------------------------------

    def _reap(self) -> None:
        for run_id, proc in list(self.children.items()):
            if proc.poll() is None:
                continue
            del self.children[run_id]
            self.downs.discard(run_id)
            run = self.store.get_run(run_id)
            done = self._final(run_id)
            self.leases.release(run_id, self.holder, done=done)
            if not done:
                self.retry_at[run_id] = time.time() + RETRY_S
            to_stderr(f"{run_id}: watch ended (exit {proc.returncode}), run {run.status if run else 'gone'}")
        if self.gc_proc is not None and self.gc_proc.poll() is not None:
            self.gc_proc = None

    def _renew(self) -> None:
        for run_id, proc in list(self.children.items()):
            if not self.leases.renew(run_id, self.holder, self.lease_s) and run_id not in self.downs:
                # A follower stops; a teardown under way goes on to its end (stopped halfway, it
                # would leave the run final with its machines still up).
                to_stderr(f"{run_id}: lease lost (another watcher holds it); stopping this one's watch")
                proc.kill()
                proc.wait()
                del self.children[run_id]

    def _adopt(self) -> None:
        taken = self.leases.taken_over()
        active = {r.id: r for r in self.store.list_runs(active_only=True)}
        for run_id in set(taken) - set(active) - set(self.children):  # ended meanwhile: forget the lease
            if run_id != GC_LEASE:
                self.leases.drop(run_id)
        now = time.time()
        for run in active.values():
            if run.id in self.children or self.retry_at.get(run.id, 0) > now or not self._ours_to_follow(run, taken):
                continue
            if self.leases.take(run.id, self.holder, self.lease_s):
                self._spawn(run.id)

    def _ours_to_follow(self, run: RunRecord, taken: dict[str, str]) -> bool:
        """Detached and launched (or taken over by a watcher before), and not still in the hands of
        the `run --detach` that launched it on this host."""
        from gpucloud.run.commands import pid_alive

        if run.id in taken:
            return True
        if not run.detached or run.status != "running":
            return False
        return not (time.time() - run.created_at < FRESH_S and pid_alive(run.pid))

    def _enforce_budgets(self) -> None:
        """Whoever is at or past a budget: their runs are taken down (`down RUN --yes` under the
        run's lease, in place of this watcher's own follower of it, if any)."""
        from gpucloud.run.budgets import over_budget_runs

        for run_id, why in over_budget_runs(self.store).items():
            child = self.children.get(run_id)
            if child is not None and run_id in self.downs:
                continue  # already being taken down
            if child is None and not self.leases.take(run_id, self.holder, self.lease_s, action="budget"):
                continue  # another watcher holds it: it enforces the same budgets
            if child is not None:
                child.kill()
                child.wait()
            to_stderr(f"{run_id}: over budget ({why}); taking it down")
            self.store.event(run_id, "budget", f"over budget: {why}; taken down by watcher {self.holder}")
            self.downs.add(run_id)
            self._spawn(run_id, ["down", run_id, "--yes"])

    def _bill_cut_short_attempts(self, run_id: str) -> None:
        """An attempt whose follower died inside provision (no handle recorded) but whose journal
        has rows since it began may have machines that bill: count it as launched, from its start to
        the teardown that will end it, rather than lose what it cost."""
        run = self.store.get_run(run_id)
        rows = self.store.resources(run_id, alive_only=True) if run else []
        for a in run.attempts if run else []:
            if not a.launched and a.ended_at is None and any(r.created_at >= a.started_at for r in rows):
                with self.store.transaction() as c:
                    c.execute("UPDATE attempts SET launched = 1 WHERE run_id = ? AND idx = ?", (run_id, a.idx))
                self.store.event(run_id, "watch", f"attempt {a.idx} was cut short in provision: counted as launched")

    def _spawn(self, run_id: str, command: list[str] | None = None) -> None:
        if command is None:
            self._bill_cut_short_attempts(run_id)
            self.store.update_run(run_id, detached=True, pid=None)  # no earlier follower's pid stops the child
            self.store.event(run_id, "watch", f"taken by watcher {self.holder}")
        log = open(self.logs / f"{run_id}.log", "ab")  # noqa: SIM115  (the child's; closed below)
        try:
            self.children[run_id] = subprocess.Popen(
                [*cli_argv(), *(command or ["watch", run_id])],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                preexec_fn=_die_with_parent,  # noqa: PLW1509  (no threads: the watcher is single-threaded)
            )
        finally:
            log.close()
        to_stderr(f"{run_id}: {' '.join(command or ['following it'])} (log {self.logs / f'{run_id}.log'})")

    def _gc_if_due(self) -> None:
        if self.gc_every_s <= 0 or self.gc_proc is not None:
            return
        if self.leases.take(GC_LEASE, self.holder, self.gc_every_s, action="gc", if_expired=True):
            log = open(self.logs / "gc.log", "ab")  # noqa: SIM115
            try:
                self.gc_proc = subprocess.Popen(
                    [*cli_argv(), "gc", "--yes"], stdin=subprocess.DEVNULL, stdout=log, stderr=log
                )
            finally:
                log.close()
            to_stderr(f"gc started (next at the earliest in {self.gc_every_s:.0f}s, by whichever watcher)")


def watch_all(*, poll_s: float, lease_s: float, gc_every_s: float) -> int:
    """`gpucloud watch --all`: tick until SIGTERM/SIGINT; the exit code is 0 once it stopped cleanly."""
    if lease_s < 3 * poll_s:
        from gpucloud.errors import UserError

        raise UserError(
            f"--lease {lease_s:g} is shorter than three polls ({poll_s:g} s each).",
            hint="A lease must outlive a few rounds of renewal: give --lease at least 3 x --poll.",
        )
    return Watcher(poll_s=poll_s, lease_s=lease_s, gc_every_s=gc_every_s).loop()


def _seconds_env(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        from gpucloud.errors import UserError

        raise UserError(
            f"{name}={os.environ[name]!r} is not a number of seconds.",
            hint=f"Unset it, or set e.g. {name}={default:g}.",
        ) from None


def watch_from_cli(run_id: str | None, every: bool) -> int:
    """`watch --all` (timings from GPUCLOUD_WATCH_POLL / _LEASE / _GC_EVERY, seconds); `watch` with
    neither a run nor --all is a usage error."""
    from gpucloud.errors import UserError

    if run_id is not None or not every:
        raise UserError(
            "`gpucloud watch` follows one run (RUN) or every detached run (--all), not both and not neither.",
            hint="`gpucloud ls` lists the runs.",
        )
    return watch_all(
        poll_s=_seconds_env("GPUCLOUD_WATCH_POLL", POLL_S),
        lease_s=_seconds_env("GPUCLOUD_WATCH_LEASE", LEASE_S),
        gc_every_s=_seconds_env("GPUCLOUD_WATCH_GC_EVERY", GC_EVERY_S),
    )
