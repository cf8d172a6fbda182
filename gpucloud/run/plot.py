"""`gpucloud cost --plot FILE` and `status RUN --plot FILE`: spend per day and per run, and a run's
GPU utilisation and memory over time, as a PNG or SVG.

matplotlib is imported here only, inside the functions, through its object API (`Figure` with the
Agg canvas, no pyplot state): `--help` and every other command never pay for it, and a missing
matplotlib is a clear error naming the extra to install (`gpucloud[plot]`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpucloud.errors import UserError

SIZE_IN = (8.0, 5.0)
DPI = 100  # 800 x 500 pixels
FORMATS = (".png", ".svg")


def _figure(path: Path, rows: int) -> Any:
    if path.suffix.lower() not in FORMATS:
        raise UserError(
            f"--plot {path}: the file must end in .png or .svg.", hint="e.g. --plot cost.png or --plot run.svg"
        )
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise UserError(
            "--plot needs matplotlib, which is not installed.",
            hint="pip install 'gpucloud[plot]' (or pip install matplotlib), then run the command again.",
        ) from None
    fig = Figure(figsize=SIZE_IN, dpi=DPI, layout="constrained")
    return fig, fig.subplots(rows, 1, squeeze=False)[:, 0]


def _save(fig: Any, path: Path) -> Path:
    try:
        fig.savefig(path, dpi=DPI)
    except OSError as exc:
        raise UserError(f"--plot {path}: cannot write it: {exc.strerror or exc}.", hint="Check the folder.") from None
    return path


def plot_cost(report: dict[str, Any], path: Path) -> Path:
    """Spend per day (UTC, by the run's start) and per run (the 20 dearest)."""
    fig, (by_day, by_run) = _figure(path, 2)
    days: dict[str, float] = {}
    for run in report["runs"]:
        day = datetime.fromtimestamp(run["created_at"], UTC).strftime("%Y-%m-%d")
        days[day] = days.get(day, 0.0) + run["cost"]
    names = sorted(days)
    by_day.bar(names, [days[d] for d in names], color="#4C72B0")
    by_day.set_ylabel("$ per day")
    by_day.set_title(f"gpucloud spend: ${report['total']['cost']:.2f} over {report['total']['runs']} run(s)")
    dearest = sorted(report["runs"], key=lambda r: r["cost"], reverse=True)[:20]
    by_run.barh([r["run_id"] for r in dearest][::-1], [r["cost"] for r in dearest][::-1], color="#DD8452")
    by_run.set_xlabel("$ per run")
    by_run.tick_params(axis="y", labelsize=6)
    return _save(fig, path)


def plot_usage(run_id: str, nodes: dict[str, dict[str, Any]], path: Path) -> Path:
    """Each node's GPU utilisation (mean over its GPUs) and memory used (its fullest GPU) over time."""
    if not nodes:
        raise UserError(
            f"run {run_id} has no GPU samples to plot.",
            hint="Samples come from runs on GPUs that started after GPU sampling existed; see `gpucloud status RUN`.",
        )
    fig, (util, mem) = _figure(path, 2)
    for rank in sorted(nodes, key=int):
        points = (nodes[rank].get("series") or {}).get("points") or []
        t = [p[0] / 60.0 for p in points]
        util.plot(t, [p[1] for p in points], label=f"node {rank}")
        mem.plot(t, [p[2] / 1024.0 for p in points], label=f"node {rank}")
        total = nodes[rank].get("mem_total_mib")
        if total:
            mem.axhline(total / 1024.0, linestyle="--", linewidth=0.8, color="grey")
    util.set_ylim(0, 100)
    util.set_ylabel("GPU utilisation %")
    util.set_title(f"run {run_id}: GPU use over time")
    mem.set_ylabel("GPU memory used, GiB")
    mem.set_xlabel("minutes since the first sample")
    if len(nodes) > 1:
        util.legend(fontsize=7)
    return _save(fig, path)


def plot_run(run_id: str | None, path: Path) -> Path:
    """`status RUN --plot` / `cost RUN --plot`: the run's GPU use from its saved samples."""
    from gpucloud.run import gpu_report
    from gpucloud.state.runs_db import Store, home_dir

    if run_id is None:
        raise UserError("status --plot draws one run's GPU use: give the run.", hint="gpucloud status RUN --plot FILE")
    run = Store().find_run(run_id)
    rid = run.id if run is not None else run_id
    return plot_usage(rid, gpu_report.load(home_dir(), rid), path)
