"""`max_cost:` (docs/SPOT.md, "max_cost"): what a run has spent so far, and the end of a run whose
spend reached its cap.

Spend is the state store's own figure, the one `gpucloud cost` reports: every launched attempt's
price per node-hour (recorded at launch) x its nodes x the time from its launch to its end (or now).
`spent` is the one function that answers "what has this run spent so far", for the CLI that
follows a run and for budgets that sum runs. The CLI (`run`, or `watch` for a detached run) asks at
every poll of the follow loop (at least once per heartbeat) and ends the run when the cap is
reached: its nodes are stopped as a Ctrl-C stops them, what the job saved comes back as artifacts,
and the run ends `max-cost` (exit 124, as a passed deadline). A detached run nobody follows is not
checked: its bound is max_duration, which `plan` already held within max_cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpucloud.state.runs_db import Store

MAX_COST_STATUS = "max-cost"
MAX_COST_EXIT = 124  # ended at a limit, as a passed max_duration
ENDED_EARLY = ("interrupted", MAX_COST_STATUS)  # the CLI ended the run: its nodes stopped, what they saved kept


def spent(store: Store, run_id: str, now: float | None = None) -> float:
    """USD the run has spent so far: every launched attempt's price x nodes x hours to its end or now."""
    run = store.get_run(run_id)
    return run.cost(time.time() if now is None else now) if run is not None else 0.0


def over(
    store: Store, run_id: str, max_cost: float | None, warn: Callable[[str], None], now: float | None = None
) -> tuple[str, int, str] | None:
    """(status, exit code, message) once the run's spend reached `max_cost` (said once, as a
    warning); None while it has not, or without a cap."""
    if max_cost is None:
        return None
    cost = spent(store, run_id, now)
    if cost < max_cost:
        return None
    message = f"max_cost ${max_cost:g} reached (spent ${cost:.4f}): the run is ended, what it saved is kept"
    warn(message)
    return MAX_COST_STATUS, MAX_COST_EXIT, message
