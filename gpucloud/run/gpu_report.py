"""What a run's GPUs really did, and the cheapest machine that would have done (right-sizing).

Each node's status.json carries its GPU sampler's summary (`"gpu"`, gpucloud/vm/agent/gpu_usage.py).
The CLI keeps the latest summary per node in the run's folder (`~/.gpucloud/runs/RUN/gpu_usage.json`)
whenever it reads statuses, so `status`, the end of `run` and `cost` show it after the machines are
gone. `right_size` names the cheapest catalog offering, on the run's cloud, with as many GPUs per
node whose memory holds the measured peak plus MARGIN, and what the run would have cost there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpucloud.run.log import run_dir
from gpucloud.state.runs_db import AttemptRecord, RunRecord

USAGE_FILE = "gpu_usage.json"
MARGIN = 0.25  # headroom over the measured peak memory: allocator growth, a larger batch at the end
MIB_PER_GIB = 1024.0


def _path(home: Path, run_id: str) -> Path:
    return run_dir(home, run_id) / USAGE_FILE


def save(home: Path, run_id: str, statuses: list[dict | None]) -> None:
    """Keep each node's latest GPU summary (a node that sent none keeps what it sent before)."""
    fresh = {str(r): st["gpu"] for r, st in enumerate(statuses) if st and isinstance(st.get("gpu"), dict)}
    if not fresh:
        return
    path = _path(home, run_id)
    nodes = {**load(home, run_id), **fresh}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"nodes": nodes}, separators=(",", ":")))
    tmp.replace(path)


def load(home: Path, run_id: str) -> dict[str, dict[str, Any]]:
    """rank (as text) -> that node's latest summary; {} when none was recorded."""
    try:
        doc = json.loads(_path(home, run_id).read_text())
    except (OSError, ValueError):
        return {}
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    return {k: v for k, v in nodes.items() if isinstance(v, dict)} if isinstance(nodes, dict) else {}


def _num(doc: dict[str, Any], key: str) -> float:
    value = doc.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def summarize(nodes: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The run's figures over every node: peak memory of any GPU, mean utilisation (weighted by
    samples), the highest node's p95, and the longest GPU-idle time of a node."""
    if not nodes:
        return None
    weight = sum(_num(n, "samples") * max(_num(n, "gpus"), 1) for n in nodes.values())
    mean = (
        sum(_num(n, "util_mean") * _num(n, "samples") * max(_num(n, "gpus"), 1) for n in nodes.values()) / weight
        if weight
        else 0.0
    )
    return {
        "nodes": len(nodes),
        "samples": int(sum(_num(n, "samples") for n in nodes.values())),
        "peak_memory_gib": round(max(_num(n, "mem_peak_mib") for n in nodes.values()) / MIB_PER_GIB, 2),
        "gpu_memory_gib": round(max(_num(n, "mem_total_mib") for n in nodes.values()) / MIB_PER_GIB, 2),
        "util_mean": round(mean, 1),
        "util_p95": max(_num(n, "util_p95") for n in nodes.values()),
        "gpu_idle_seconds": round(max(_num(n, "idle_s") for n in nodes.values()), 1),
    }


def right_size(summary: dict[str, Any], attempt: AttemptRecord, billed_seconds: float) -> dict[str, Any] | None:
    """The cheapest offering on the attempt's cloud (its region first) with the same GPUs per node
    and CPU architecture whose per-GPU memory holds the peak + MARGIN, in the attempt's market; None when the run's
    machine is not in the catalog (the local machine, an SSH host)."""
    from gpucloud.catalog import load_catalog

    cat = load_catalog()
    rows = cat.query(cloud=attempt.cloud)
    mine = next((o for o in rows if o.instance_type == attempt.instance_type), None)
    if mine is None:
        return None
    need = summary["peak_memory_gib"] * (1 + MARGIN)

    def price(o: Any) -> float | None:
        return o.spot_price_per_hour if attempt.spot else o.price_per_hour

    fits = [
        o
        for o in rows
        if o.gpu_count == mine.gpu_count
        and o.arch == mine.arch  # an x86_64 job's wheels and binaries need not run on arm64
        and o.status != "retired"
        and cat.gpus[o.gpu].memory_gib >= need
        and price(o) is not None
    ]
    here = [o for o in fits if o.region == attempt.region]
    pool = here or fits
    if not pool:
        return None
    best = min(pool, key=lambda o: (price(o), o.region != attempt.region, o.instance_type))
    hourly = float(price(best) or 0.0)
    would = hourly * attempt.num_nodes * billed_seconds / 3600.0
    paid = attempt.price_per_hour * attempt.num_nodes * billed_seconds / 3600.0
    return {
        "needed_gib_per_gpu": round(need, 2),
        "margin": MARGIN,
        "cloud": best.cloud,
        "region": best.region,
        "instance_type": best.instance_type,
        "gpu": best.gpu,
        "gpu_count": best.gpu_count,
        "market": "spot" if attempt.spot else "on-demand",
        "price_per_hour": hourly,
        "would_have_cost": round(would, 6),
        "cost": round(paid, 6),
        "saving": round(paid - would, 6),
        "same_machine": best.instance_type == attempt.instance_type,
    }


def run_usage(home: Path, run: RunRecord, now: float) -> dict[str, Any] | None:
    """`gpu_usage` of `cost RUN --json`: the summary, and right-sizing from the last launched attempt."""
    summary = summarize(load(home, run.id))
    if summary is None:
        return None
    doc: dict[str, Any] = {**summary}
    launched = [a for a in run.attempts if a.launched]
    if launched:
        att = launched[-1]
        end = att.ended_at if att.ended_at is not None else (run.ended_at if run.ended_at is not None else now)
        doc["right_size"] = right_size(summary, att, max(0.0, end - att.started_at))
    return doc


def usage_of(run_id: str) -> dict[str, Any] | None:
    """A run's GPU use by id (the CI summary after `run`); None when it was not sampled."""
    import time

    from gpucloud.state.runs_db import Store, home_dir

    run = Store().get_run(run_id)
    return run_usage(home_dir(), run, time.time()) if run is not None else None


def usage_lines(doc: dict[str, Any]) -> list[str]:
    """The human lines of a run's GPU use (end of `run`, `status RUN`, `cost RUN`)."""
    lines = [
        f"GPU use: peak memory {doc['peak_memory_gib']:g} of {doc['gpu_memory_gib']:g} GiB per GPU, "
        f"utilisation mean {doc['util_mean']:g} % / p95 {doc['util_p95']:g} %, "
        f"GPU-idle {doc['gpu_idle_seconds']:g} s ({doc['samples']} samples)"
    ]
    fit = doc.get("right_size")
    if fit and not fit["same_machine"] and fit["saving"] > 0:
        lines.append(
            f"right-size: {fit['instance_type']} ({fit['gpu_count']} × {fit['gpu']}, {fit['region']}, "
            f"{fit['market']} ${fit['price_per_hour']:.3f}/h) holds the peak + {fit['margin']:.0%}; this run "
            f"would have cost ${fit['would_have_cost']:.4f} there instead of ${fit['cost']:.4f}"
        )
    elif fit:
        lines.append("right-size: no cheaper machine on this cloud holds the measured peak memory")
    return lines


def node_lines(nodes: dict[str, dict[str, Any]]) -> list[str]:
    """`status RUN`: each node's latest values per GPU."""
    out = []
    for rank in sorted(nodes, key=int):
        now = nodes[rank].get("now") or []
        cells = []
        for i, g in enumerate(now):
            if not isinstance(g, list) or len(g) != 5:
                continue
            util, used, total, power, temp = g
            cells.append(
                f"gpu{i} {f'{util:g}' if util is not None else '?'} % "
                f"{(used or 0) / MIB_PER_GIB:.1f}/{(total or 0) / MIB_PER_GIB:.0f} GiB"
                + (f" {power:g} W" if power is not None else "")
                + (f" {temp:g} C" if temp is not None else "")
            )
        out.append(f"node {rank}: " + ("; ".join(cells) or "no sample yet"))
    return out
