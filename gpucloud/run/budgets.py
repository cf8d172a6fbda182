"""Budgets that stop spending: per user and per team, per UTC day and per UTC month, kept in the
state store (a team's shared PostgreSQL store, or one's own file) and set with `gpucloud budget set`.

Spend is what `cost` counts (price x nodes x the time each launched attempt ran), cut to the
period: an attempt that began yesterday counts today only from midnight. A team's spend is its
members'. Two places enforce them: `run` refuses a launch whose worst case (the first candidate's
price for the whole max_duration) would take the user or one of their teams past a budget, before
anything is created (BudgetError, exit 77); `gpucloud watch --all` ends the runs of whoever is over.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpucloud.errors import GpucloudError
from gpucloud.state.runs_db import AttemptRecord, RunRecord, Store, current_user

PERIODS = ("daily", "monthly")
SCOPES = ("user", "team")


class BudgetError(GpucloudError):
    """A launch would take its user or team past a budget: nothing was created. Exit 77 (EX_NOPERM)."""

    exit_code = 77
    kind = "budget"


@dataclass(frozen=True)
class Budget:
    scope: str  # user | team
    name: str
    period: str  # daily | monthly
    amount: float


def period_start(period: str, now: float) -> float:
    """The start of the UTC day or month that holds `now`."""
    t = time.gmtime(now)
    day = 1 if period == "monthly" else t.tm_mday
    return float(calendar.timegm((t.tm_year, t.tm_mon, day, 0, 0, 0)))


def attempt_spend(a: AttemptRecord, start: float, now: float, run_end: float | None) -> float:
    """What one attempt cost from `start` on (its open end: the run's end, or now)."""
    if not a.launched or not a.price_per_hour:
        return 0.0
    end = a.ended_at if a.ended_at is not None else (run_end if run_end is not None else now)
    return a.price_per_hour * a.num_nodes * max(0.0, end - max(start, a.started_at)) / 3600.0


def spend(runs: Iterable[RunRecord], owners: set[str], start: float, now: float) -> float:
    return sum(
        attempt_spend(a, start, now, r.ended_at)
        for r in runs
        if r.owner in owners and (r.ended_at is None or r.ended_at >= start)
        for a in r.attempts
    )


# ---- the tables ------------------------------------------------------------------------------------


def budgets(store: Store) -> list[Budget]:
    rows = store.query("SELECT scope, name, period, amount FROM budgets ORDER BY scope, name, period")
    return [Budget(r["scope"], r["name"], r["period"], float(r["amount"])) for r in rows]


def members(store: Store, team: str) -> set[str]:
    return {r["member"] for r in store.query("SELECT member FROM team_members WHERE team = ?", (team,))}


def teams_of(store: Store, user: str) -> set[str]:
    return {r["team"] for r in store.query("SELECT team FROM team_members WHERE member = ?", (user,))}


def set_budget(store: Store, scope: str, name: str, period: str, amount: float | None) -> None:
    """Set (or, with amount None or 0, remove) one budget."""
    with store.transaction() as c:
        c.execute("DELETE FROM budgets WHERE scope = ? AND name = ? AND period = ?", (scope, name, period))
        if amount:
            c.execute(
                "INSERT INTO budgets (scope, name, period, amount, set_by, set_at) VALUES (?,?,?,?,?,?)",
                (scope, name, period, float(amount), current_user(), time.time()),
            )


def set_members(store: Store, team: str, add: Iterable[str], remove: Iterable[str]) -> None:
    with store.transaction() as c:
        for user in remove:
            c.execute("DELETE FROM team_members WHERE team = ? AND member = ?", (team, user))
        for user in add:
            c.execute(
                "INSERT INTO team_members (team, member) VALUES (?,?) ON CONFLICT(team, member) DO NOTHING",
                (team, user),
            )


# ---- what they say ---------------------------------------------------------------------------------


def _owners(store: Store, b: Budget) -> set[str]:
    return {b.name} if b.scope == "user" else members(store, b.name)


def status(store: Store, now: float | None = None) -> list[dict[str, Any]]:
    """Each budget with what was spent against it this period (the `cost` report's `budgets`)."""
    now = time.time() if now is None else now
    found = budgets(store)
    runs = store.list_runs() if found else []
    out = []
    for b in found:
        start = period_start(b.period, now)
        spent = spend(runs, _owners(store, b), start, now)
        out.append(
            {
                "scope": b.scope,
                "name": b.name,
                "period": b.period,
                "since": start,
                "budget": b.amount,
                "spent": round(spent, 6),
                "left": round(b.amount - spent, 6),
                "over": spent >= b.amount,
            }
        )
    return out


def _applying(store: Store, user: str, state: list[dict[str, Any]]) -> list[dict[str, Any]]:
    teams = teams_of(store, user)
    return [
        s
        for s in state
        if (s["scope"] == "user" and s["name"] == user) or (s["scope"] == "team" and s["name"] in teams)
    ]


def check_launch(worst_case: float, max_duration_s: float) -> None:
    """Refuse the launch (before anything is created) when its worst case would take the user, or a
    team of theirs, past a budget. A store without budgets costs one query."""
    store = Store()
    if not store.query("SELECT 1 AS one FROM budgets LIMIT 1"):
        return
    user = current_user()
    for s in _applying(store, user, status(store)):
        if s["spent"] + worst_case > s["budget"]:
            who = f"user {user}" if s["scope"] == "user" else f"team {s['name']} (of which {user} is a member)"
            raise BudgetError(
                f"Not launched: this run could cost up to ${worst_case:.2f} (its first candidate for the whole "
                f"max_duration of {max_duration_s / 3600:g} h), and {who} has spent ${s['spent']:.2f} of its "
                f"{s['period']} budget of ${s['budget']:.2f}.",
                hint="Shorten max_duration, pick a cheaper machine, wait for the next period, or ask whoever "
                "keeps the budgets to raise it (`gpucloud budget ls` shows them, `gpucloud cost` the spend).",
            )


def over_budget_runs(store: Store, now: float | None = None) -> dict[str, str]:
    """Active runs whose owner (or the owner's team) is at or past a budget -> why, for the watcher."""
    state = [s for s in status(store, now) if s["over"]]
    if not state:
        return {}
    out: dict[str, str] = {}
    for run in store.list_runs(active_only=True):
        if run.owner is None:
            continue
        for s in _applying(store, run.owner, state):
            out.setdefault(
                run.id,
                f"{s['scope']} {s['name']} spent ${s['spent']:.2f} of its {s['period']} budget of ${s['budget']:.2f}",
            )
    return out
