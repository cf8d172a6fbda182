"""`gpucloud cost`: what runs cost, per run and per attempt, from the state store's attempts table
(docs/SPOT.md, "Cost report").

Billed time is the attempt's launch (when its machines were asked for) to its end (teardown, or
the run's end), for each node; the price is the one recorded at launch. The saving is what the
same node-seconds would have cost on-demand (the catalog's on-demand price of the same type in the
same region) minus what they cost. A run that never launched a machine costs $0.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from functools import cache
from typing import Any

from gpucloud.errors import UserError
from gpucloud.state.runs_db import AttemptRecord, RunRecord, Store, current_user


def parse_since(text: str | None) -> float | None:
    """`--since 2026-12-01` or `2026-12-01T08:00` (UTC unless an offset is given) -> epoch seconds."""
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"--since {text!r} is not a date.", hint="Use YYYY-MM-DD or YYYY-MM-DDTHH:MM (UTC).") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


@cache
def on_demand_price(cloud: str, region: str, instance_type: str) -> float | None:
    """The catalog's on-demand price per node-hour of the type in that region (None: not in the catalog)."""
    from gpucloud.catalog import load_catalog

    try:
        rows = load_catalog().query(cloud=cloud, region=region, include_retired=True)
    except Exception:  # an unpriced provider has no catalog rows at all
        return None
    return next((o.price_per_hour for o in rows if o.instance_type.lower() == instance_type.lower()), None)


def _attempt_doc(run: RunRecord, att: AttemptRecord, now: float) -> dict[str, Any]:
    end = att.ended_at if att.ended_at is not None else (run.ended_at if run.ended_at is not None else now)
    billed = max(0.0, end - att.started_at) if att.launched else 0.0
    cost = att.cost(end)
    od = att.price_per_hour if not att.spot else on_demand_price(att.cloud, att.region, att.instance_type or "")
    od_cost = (od or 0.0) * att.num_nodes * billed / 3600.0 if od is not None else cost
    return {
        "attempt": att.idx + 1,
        "cloud": att.cloud,
        "region": att.region,
        "zone": att.zone,
        "instance_type": att.instance_type,
        "market": "spot" if att.spot else "on-demand",
        "price_per_hour": att.price_per_hour,
        "on_demand_price_per_hour": od,
        "launched": att.launched,
        "started_at": att.started_at,
        "ended_at": att.ended_at,
        "end_reason": att.end_reason,
        "nodes": [{"rank": r, "billed_seconds": round(billed, 3)} for r in range(att.num_nodes)],
        "billed_seconds": round(billed * att.num_nodes, 3),
        "cost": round(cost, 6),
        "on_demand_cost": round(od_cost, 6),
        "saving": round(od_cost - cost, 6),
    }


def run_cost(run: RunRecord, now: float) -> dict[str, Any]:
    attempts = [_attempt_doc(run, a, now) for a in run.attempts]
    cost = sum(a["cost"] for a in attempts)
    od = sum(a["on_demand_cost"] for a in attempts)
    return {
        "run_id": run.id,
        "name": run.name,
        "status": run.status,
        "owner": run.owner,
        "created_at": run.created_at,
        "attempts": attempts,
        "launched_attempts": sum(1 for a in attempts if a["launched"]),
        "cost": round(cost, 6),
        "on_demand_cost": round(od, 6),
        "saving": round(od - cost, 6),
    }


def cost_report(run_ref: str | None = None, *, since: str | None = None, all_users: bool = False) -> dict[str, Any]:
    """The report `gpucloud cost [RUN] [--since DATE] [--all-users] --json` prints (on a shared
    store, the user's own runs unless all_users; each run names its owner)."""
    store = Store()
    now = time.time()
    if run_ref is not None:
        run = store.find_run(run_ref)
        if run is None:
            raise UserError(f"no run {run_ref!r} in {store.path}.", hint="`gpucloud ls` lists the runs.")
        runs = [run]
    else:
        start = parse_since(since)
        owner = current_user() if store.shared and not all_users else None
        runs = [r for r in store.list_runs(owner=owner) if start is None or r.created_at >= start]
    docs = [run_cost(r, now) for r in runs]
    if run_ref is not None:  # one run: what its GPUs did and the machine that would have done
        from gpucloud.run import gpu_report
        from gpucloud.state.runs_db import home_dir

        docs[0]["gpu_usage"] = gpu_report.run_usage(home_dir(), runs[0], now)
    cost = sum(d["cost"] for d in docs)
    od = sum(d["on_demand_cost"] for d in docs)
    from gpucloud.run.budgets import status

    return {
        "budgets": status(store, now),
        "runs": docs,
        "total": {
            "runs": len(docs),
            "cost": round(cost, 6),
            "on_demand_cost": round(od, 6),
            "saving": round(od - cost, 6),
        },
    }
