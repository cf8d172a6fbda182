"""Watching a run: the one place that turns the nodes' status.json documents (read through the
channel) and the provider's node states into an observation, and an observation into an outcome.

Both the CLI that follows a run (`lifecycle`) and the commands that look at a run later
(`commands`: status, logs, gc) use it, so "the machine is gone without a final status -> lost"
is decided here only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpucloud.channel.trust import IGNORED
from gpucloud.ui.untrusted import shown
from gpucloud.vm import protocol

if TYPE_CHECKING:
    from gpucloud.channel.run_objects import Channel

VM_STAGES = protocol.STAGES  # the wire format's own order (status.json `stages`)
VM_FINAL_STATES = protocol.FINAL_STATES
PREEMPTED_EXIT = 75  # a run that ended preempted with no restart left: temporary, try again (docs/SPOT.md)
STALE_HEARTBEATS = 3  # a node is suspect after this many missed heartbeats
DEAD_NODE_STATES = ("gone", "stopping")
FINAL_WAIT_S = 20.0  # after the teardown of a run the CLI ended: how long its nodes get to say they ended
REFUSED_EXIT = 65  # EX_DATAERR: the node's exit code is not one a process can have (README, exit codes)


def is_final(st: dict | None) -> bool:
    return bool(st and st.get("state") in VM_FINAL_STATES)


@dataclass
class Observation:
    """What the run looks like now. `lost`: ranks whose machine is gone (or stopping) and that
    wrote no final status, even on a second read (a node may write it just before it ends)."""

    statuses: list[dict | None]
    lost: list[int]

    @property
    def finals(self) -> list[bool]:
        return [is_final(st) for st in self.statuses]

    @property
    def preempted(self) -> list[int]:
        """Ranks that reported an interruption notice (state "preempted")."""
        return [r for r, st in enumerate(self.statuses) if st and st.get("state") == "preempted"]

    @property
    def all_final(self) -> bool:
        return bool(self.statuses) and all(self.finals)

    @property
    def notes(self) -> list[str]:
        """Fields the nodes' statuses carried that the CLI dropped (channel_trust.checked), fenced."""
        return [shown(n) for st in self.statuses if st for n in st.get(IGNORED) or [] if isinstance(n, str)]

    def stage(self, ranks: list[int] | None = None) -> str | None:
        """The first stage any of `ranks` (default: every node) reported."""
        picked = self.statuses if ranks is None else [self.statuses[r] for r in ranks]
        return next((st.get("stage") for st in picked if st and st.get("stage")), None)


def observe(channel: Channel, run_id: str, num_nodes: int, node_states: list[str] | None = None) -> Observation:
    """Read every node's status; with the provider's node states, re-read the dead nodes and name
    the ones lost."""
    statuses = [channel.read_status(run_id, r) for r in range(num_nodes)]
    dead = [
        r
        for r, s in list(enumerate(node_states or []))[:num_nodes]
        if s in DEAD_NODE_STATES and not is_final(statuses[r])
    ]
    for r in dead:
        statuses[r] = channel.read_status(run_id, r)
    return Observation(statuses=statuses, lost=[r for r in dead if not is_final(statuses[r])])


def wait_final(channel: Channel, run_id: str, num_nodes: int, timeout: float = FINAL_WAIT_S) -> bool:
    """Whether every node wrote its final status within `timeout`: a node stopped by the teardown
    (SIGTERM as its machine goes) uploads what its job saved first, then says it ended."""
    end = time.monotonic() + timeout
    while True:
        try:
            if observe(channel, run_id, num_nodes).all_final:
                return True
        except Exception:  # noqa: BLE001 - a channel the teardown removed: nothing more will come
            return False
        if time.monotonic() > end:
            return False
        time.sleep(0.5)


def stale(statuses: list[dict | None], booted_at: float, now: float, heartbeat_s: float) -> bool:
    """Whether some node missed STALE_HEARTBEATS heartbeats (or never reported): time to ask the
    provider whether its machine still exists."""
    limit = STALE_HEARTBEATS * heartbeat_s
    for st in statuses:
        if st is None:
            if now - booted_at > limit:
                return True
            continue
        if is_final(st):
            continue
        beat = st.get("heartbeat")
        if not isinstance(beat, (int, float)) or now - beat > limit:
            return True
    return False


def vm_phases(statuses: list[dict | None]) -> dict[str, float]:
    """Seconds per VM stage (the slowest node's, for multi-node runs)."""
    out: dict[str, float] = {}
    for st in statuses:
        for name, info in ((st or {}).get("stages") or {}).items():
            if not isinstance(info, dict) or name == "done":
                continue
            start, end = info.get("start"), info.get("end")
            if isinstance(start, (int, float)) and isinstance(end, (int, float)):
                out[name] = max(out.get(name, 0.0), float(end) - float(start))
    return {k: out[k] for k in sorted(out, key=stage_order)}


def stage_order(name: str) -> int:
    return VM_STAGES.index(name) if name in VM_STAGES else 99


def _end_time(st: dict | None) -> float:
    """When a node reached its final state, by its own clock (the `done` stage's start)."""
    done = ((st or {}).get("stages") or {}).get("done")
    start = done.get("start") if isinstance(done, dict) else None
    if isinstance(start, (int, float)):
        return float(start)
    beat = (st or {}).get("heartbeat")
    return float(beat) if isinstance(beat, (int, float)) else float("inf")


def _exit_byte(code: object) -> bool:
    """A process's exit status: an int (not a bool) from 0 to 255; anything else would wrap or lie."""
    return isinstance(code, int) and not isinstance(code, bool) and 0 <= code <= 255


def ended_at(statuses: list[dict | None]) -> float | None:
    """When the last node reached its final state, by the nodes' own clocks; None when one did not
    say. A run nobody followed ends there, not when someone later collected or listed it: its
    machines ended themselves then, and `cost`, max_cost and budgets bill to it."""
    ends = [_end_time(st) for st in statuses]
    return max(ends) if ends and all(e != float("inf") for e in ends) else None


def outcome(statuses: list[dict | None], seen: list[float | None] | None = None) -> tuple[str, int, str]:
    """(run status, exit code, message) from the nodes' final status.json documents.

    Several nodes: the exit code is rank 0's unless another rank failed first; "first" goes by the
    nodes' own end times (whole seconds), then by when the CLI saw them end (`seen`), and rank 0
    wins a tie. A node stopped because a peer failed ends later, so it is never the one blamed.
    """
    n = len(statuses)
    seen = list(seen or []) + [None] * (n - len(seen or []))
    states = [(st or {}).get("state") for st in statuses]
    codes = [(st or {}).get("exit_code") for st in statuses]
    messages = [shown((st or {}).get("message") or "") for st in statuses]  # the job or node wrote it
    if "preempted" in states:
        rank = states.index("preempted")
        where = f"node {rank} " if n > 1 else ""
        return "preempted", PREEMPTED_EXIT, f"{where}{messages[rank] or 'preempted'}"
    if "deadline" in states:
        from gpucloud.run.budget import MAX_COST_STATUS, NODE_SAYS

        said = next((m for s, m in zip(states, messages, strict=False) if s == "deadline" and m), "")
        return (MAX_COST_STATUS if said.startswith(NODE_SAYS) else "deadline"), 124, said  # the deadline max_cost set
    bad = [r for r in range(n) if states[r] in ("failed", "error")]
    if bad:
        inf = float("inf")
        rank = min(bad, key=lambda r: (_end_time(statuses[r]), seen[r] if seen[r] is not None else inf, r != 0, r))
        state, code, message = states[rank], codes[rank], messages[rank]
        status = "failed" if state == "failed" else "error"
        if code is not None and not _exit_byte(code):
            status, message = "error", f"node {rank} reported exit code {shown(repr(code), limit=40)}, not 0 to 255"
            code = REFUSED_EXIT
        elif not code:
            code = 1 if state == "failed" else 70
        if n > 1:
            first = " first" if any(states[r] != "succeeded" for r in range(n) if r != rank) else ""
            message = f"node {rank} failed{first}: {message or f'exit code {code}'}"
        return status, code, message
    if all(s == "succeeded" for s in states):
        return "succeeded", 0, ""
    return "lost", 70, "a node stopped without reporting a final status"
