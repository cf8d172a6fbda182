"""`max_cost:` (docs/SPOT.md, "max_cost"): what a run has spent so far, the deadline its cap sets
each attempt, and the end of a run whose spend reached it.

Spend is the state store's own figure, the one `gpucloud cost` reports (`RunRecord.cost`): every
launched attempt's price per node-hour (recorded at launch) x its nodes x the time from its launch
request to its end (or now). `spent` answers it for one run, `spent_by` for a budget's period.

The node holds the cap itself: each attempt's deadline is min(max_duration, what max_cost leaves at
its price) (`attempt_limit`), so every deadline layer (the agent's watchdog, the backstop, the
cloud's schedule, the expiry tag gc reads) ends the run at its cap with nobody following it; the
agent uploads what the job saved and says `max_cost $X reached`, which `watch.outcome` reads as
status `max-cost` (exit 124, as a passed deadline). A CLI that follows the run (`run`, `watch`)
also checks the spend at every poll and, should the node not have ended the run NODE_GRACE_S
past its deadline, ends it as Ctrl-C does: nodes stopped, what they saved brought back.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

from gpucloud.state.runs_db import RunRecord, Store

MAX_COST_STATUS = "max-cost"
MAX_COST_EXIT = 124  # ended at a limit, as a passed max_duration
ENDED_EARLY = ("interrupted", MAX_COST_STATUS)  # the CLI ended the run: its nodes stopped, what they saved kept
NODE_SAYS = "max_cost "  # how the node's final message begins when the cap was its deadline
NODE_GRACE_S = 30.0  # a follower leaves the end at the cap to the node this long (its artifacts go up first)


def spent(store: Store, run_id: str, now: float | None = None) -> float:
    """USD the run has spent so far: every launched attempt's price x nodes x hours to its end or now."""
    run = store.get_run(run_id)
    return run.cost(time.time() if now is None else now) if run is not None else 0.0


def spent_by(runs: Iterable[RunRecord], owners: set[str], since: float, now: float) -> float:
    """USD the runs of `owners` spent from `since` (a budget's UTC day or month) to `now`: the same
    figure as `spent`, cut to the period."""
    return sum(r.cost(now, since) for r in runs if r.owner in owners and (r.ended_at is None or r.ended_at >= since))


def attempt_limit(
    store: Store, run_id: str, max_duration: int, max_cost: float | None, per_hour: float, now: float | None = None
) -> tuple[int, str]:
    """(seconds from now to the attempt's deadline, what the node says at it): max_duration, or
    less when max_cost runs out first at `per_hour` (price x nodes). The attempt being made is
    recorded but not launched, so counts from its request on, as `spent` will count it; whole
    seconds (as the node's deadline), rounded up: the spend has reached the cap when it ends."""
    if max_cost is None or per_hour <= 0 or (run := store.get_run(run_id)) is None:
        return max_duration, ""
    now = time.time() if now is None else now
    pending = [a.started_at for a in run.attempts if not a.launched and a.ended_at is None]
    left_s = (max_cost - run.cost(now)) / per_hour * 3600 - (now - (pending[-1] if pending else now))
    if left_s >= max_duration:
        return max_duration, ""
    return max(1, math.ceil(left_s)), f"{NODE_SAYS}${max_cost:g} reached"


def node_end(
    result: tuple[str, int, str], store: Store, run_id: str, warn: Callable[[str], None]
) -> tuple[str, int, str]:
    """A run the node ended at its max_cost deadline (`watch.outcome` made it `max-cost`): its
    message with the spend, as the follower's own end says it (said once, as a warning)."""
    status, code, message = result
    if status != MAX_COST_STATUS:
        return result
    head = message.split(" (deadline", 1)[0]
    message = f"{head} (spent ${spent(store, run_id):.4f}): the machine ended the run at it, what it saved is kept"
    warn(message)
    return status, code, message


def over(
    store: Store, run_id: str, max_cost: float | None, warn: Callable[[str], None], now: float | None = None
) -> tuple[str, int, str] | None:
    """(status, exit code, message) once the run's spend reached `max_cost` and its node did not end
    it at its deadline (NODE_GRACE_S past it); None before, or without a cap. Said once, as a warning."""
    if max_cost is None:
        return None
    now = time.time() if now is None else now
    run = store.get_run(run_id)
    cost = run.cost(now) if run is not None else 0.0
    if cost < max_cost or (run is not None and run.deadline is not None and now < run.deadline + NODE_GRACE_S):
        return None
    message = f"max_cost ${max_cost:g} reached (spent ${cost:.4f}): the run is ended, what it saved is kept"
    warn(message)
    return MAX_COST_STATUS, MAX_COST_EXIT, message


def spent_before_relaunch(
    store: Store, run_id: str, max_cost: float | None, after: str, warn: Callable[[str], None]
) -> tuple[str, int, str] | None:
    """(status, exit code, message) when an attempt ended `after` (preempted, lost) with the run's
    max_cost already spent: no relaunch, the run ends at its cap as the node would have ended it,
    rather than as a refused launch. None while money is left, or without a cap."""
    if max_cost is None or (cost := spent(store, run_id)) < max_cost:
        return None
    message = f"max_cost ${max_cost:g} reached (spent ${cost:.4f}): not relaunched after {after}, what it saved is kept"
    warn(message)
    return MAX_COST_STATUS, MAX_COST_EXIT, message
