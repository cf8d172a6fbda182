"""The records the state store hands out (runs, attempts, resources, events) and the run statuses.

They are plain dataclasses with the figures `status`/`ls` derive from a row (elapsed time, cost),
so readers of the store need no SQL and no open connection.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

# Run statuses. A run is "active" until it reaches one of FINAL_STATUSES.
# "kept": the job ended and its machine waits for the next one (keep:, run/keep.py).
ACTIVE_STATUSES = ("planned", "provisioning", "running", "collecting", "tearing-down", "kept")
# "down-pending": `down` could not reach the machines; `down` and `gc` try again, then it becomes "down".
FINAL_STATUSES = (
    "succeeded",
    "failed",
    "deadline",
    "interrupted",
    "max-cost",  # the CLI ended it when its spend reached max_cost (run/budget.py)
    "lost",
    "error",
    "no-capacity",
    "down",
    "preempted",
    "down-pending",
)


@dataclass
class AttemptRecord:
    """One launch attempt of a run (one candidate of the failover order)."""

    run_id: str
    idx: int
    cloud: str
    region: str
    zone: str | None
    instance_type: str | None
    spot: bool
    price_per_hour: float
    num_nodes: int
    started_at: float
    ended_at: float | None
    end_reason: str | None
    launched: bool
    handle_json: str | None

    def cost(self, now: float | None = None, since: float | None = None) -> float:
        """price per node-hour x nodes x hours from the request to the end (or `now` while open);
        $0 if nothing launched. `since`: only the part from then on (a budget's period)."""
        if not self.launched or not self.price_per_hour:
            return 0.0
        end = self.ended_at if self.ended_at is not None else (now if now is not None else time.time())
        start = self.started_at if since is None else max(since, self.started_at)
        return self.price_per_hour * self.num_nodes * max(0.0, end - start) / 3600.0


@dataclass
class RunRecord:
    """One row of `runs`, with the derived figures `status`/`ls` show."""

    id: str
    name: str
    spec_path: str | None
    spec_json: str | None
    cloud: str | None
    region: str | None
    instance_type: str | None
    num_nodes: int
    price_per_hour: float
    status: str
    phase: str | None
    exit_code: int | None
    message: str | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    deadline: float | None
    artifacts_dir: str | None
    detached: bool
    pid: int | None
    owner: str | None = None  # who launched it (None: a run recorded before owners were kept)
    attempts: list[AttemptRecord] = field(default_factory=list)

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES

    def elapsed(self, now: float | None = None) -> float:
        """Seconds since the run was created, up to its end when it has ended."""
        end = self.ended_at if self.ended_at is not None else (now if now is not None else time.time())
        return max(0.0, end - self.created_at)

    def cost(self, now: float | None = None, since: float | None = None) -> float:
        """Cost so far: the sum over the launched attempts (a run that launched nothing costs $0).
        An attempt still open ends at the run's end, or now. `since`: only what was spent from
        then on (a budget's day or month). The one spend formula: `cost`, `max_cost` and budgets."""
        if self.ended_at is not None:
            now = self.ended_at
        return round(float(sum(a.cost(now, since) for a in self.attempts)), 6)

    def as_json(self, now: float | None = None) -> dict[str, Any]:
        return {
            "run_id": self.id,
            "name": self.name,
            "status": self.status,
            "phase": self.phase,
            "exit_code": self.exit_code,
            "cloud": self.cloud,
            "region": self.region,
            "instance_type": self.instance_type,
            "num_nodes": self.num_nodes,
            "price_per_hour": self.price_per_hour,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "deadline": self.deadline,
            "elapsed": round(self.elapsed(now), 3),
            "cost": round(self.cost(now), 6),
            "artifacts_dir": self.artifacts_dir,
            "detached": self.detached,
            "spec_path": self.spec_path,
            "message": self.message,
            "owner": self.owner,
        }


@dataclass
class ResourceRecord:
    """One thing a provider created (or was about to create) for a run."""

    id: int
    run_id: str
    cloud: str
    region: str | None
    kind: str
    name: str | None
    cloud_id: str | None
    status: str  # intent | created | deleted
    created_at: float
    updated_at: float


@dataclass
class EventRecord:
    run_id: str
    ts: float
    kind: str
    message: str


def attempt_from_row(row: sqlite3.Row | dict[str, Any]) -> AttemptRecord:
    d = dict(row)
    d["spot"], d["launched"] = bool(d["spot"]), bool(d["launched"])
    return AttemptRecord(**d)


def run_from_row(row: sqlite3.Row | dict[str, Any]) -> RunRecord:
    d = dict(row)
    d["detached"] = bool(d["detached"])
    return RunRecord(**d)
