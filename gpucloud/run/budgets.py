"""Budgets that stop spending: per user and per team, per UTC day and per UTC month, kept in the
state store (a team's shared PostgreSQL store, or one's own file) and set with `gpucloud budget set`.

Spend is what `cost` counts (price x nodes x the time each launched attempt ran), cut to the
period by run/budget.py `spent_by`: an attempt that began yesterday counts today only from
midnight. A team's spend is its members'. Three places enforce them: `run` refuses a launch whose
worst case (the first candidate's price for the whole max_duration, or the run's max_cost when
lower) would take the user or one of their teams past a budget, before anything is created
(BudgetError, exit 77); the failover checks every later candidate (a dearer one, a relaunch) the
same way before its create; `gpucloud watch --all` ends the runs of whoever is over.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpucloud.errors import GpucloudError
from gpucloud.run.budget import spent_by
from gpucloud.state.runs_db import Store, current_user


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
        spent = spent_by(runs, _owners(store, b), start, now)
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


def worst_case(estimated_cost: float, max_cost: float | None, spent: float = 0.0) -> float:
    """The most a launch can spend: its candidate for the whole max_duration, or what the run's
    max_cost leaves (the node ends the run there: run/budget.py)."""
    return estimated_cost if max_cost is None else min(estimated_cost, max(0.0, max_cost - spent))


def refusal(store: Store, worst: float, max_duration_s: float, what: str = "its first candidate") -> BudgetError | None:
    """The refusal of a launch whose worst case would take the user, or a team of theirs, past a
    budget; None when it fits. A store without budgets costs one query."""
    if worst <= 0 or not store.query("SELECT 1 AS one FROM budgets LIMIT 1"):
        return None
    user = current_user()
    for s in _applying(store, user, status(store)):
        if s["spent"] + worst > s["budget"]:
            who = f"user {user}" if s["scope"] == "user" else f"team {s['name']} (of which {user} is a member)"
            return BudgetError(
                f"Not launched: this run could cost up to ${worst:.2f} ({what} for the whole "
                f"max_duration of {max_duration_s / 3600:g} h, or its max_cost), and {who} has spent "
                f"${s['spent']:.2f} of its {s['period']} budget of ${s['budget']:.2f}.",
                hint="Shorten max_duration, pick a cheaper machine, wait for the next period, or ask whoever "
                "keeps the budgets to raise it (`gpucloud budget ls` shows them, `gpucloud cost` the spend).",
            )
    return None


def check_launch(worst: float, max_duration_s: float) -> None:
    """Refuse the launch (before anything is created) when its worst case would take the user, or a
    team of theirs, past a budget. The failover checks each later candidate again (failover.py)."""
    refused = refusal(Store(), worst, max_duration_s)
    if refused is not None:
        raise refused


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
