"""The boot timeline of a VM: where its billed time went, stage group by stage group.

The VM agent already records every stage's start and end in status.json `stages` (see
gpucloud/vm/agent/status.py). This module folds them into the groups a user cares about (boot,
stack, fetch, inputs, pull, setup, run, outputs, artifacts) and prints one line per node, so that `status` and the run
summary can show that, say, 9 of 11 minutes went to the driver install before the job started.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from gpucloud.vm.protocol import STAGE_GROUPS


def _groups() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(group, its stages) in the wire format's order: the stages are declared once, with their group,
    in gpucloud/vm/protocol.py. "boot" also covers the time from launch to the first stage (the cloud
    starting the machine and cloud-init), when the launch time is known."""
    names: dict[str, list[str]] = {}
    for stage, group in STAGE_GROUPS:
        names.setdefault(group, []).append(stage)
    return tuple((group, tuple(stages)) for group, stages in names.items())


GROUPS = _groups()


def _seconds(info: object, now: float) -> tuple[float, bool] | None:
    """(seconds, still running) of one stage entry, or None when it is malformed or not started."""
    if not isinstance(info, Mapping):
        return None
    start, end = info.get("start"), info.get("end")
    if not isinstance(start, (int, float)):
        return None
    if isinstance(end, (int, float)):
        return max(0.0, float(end) - float(start)), False
    return max(0.0, now - float(start)), True


def stage_groups(
    stages: Mapping[str, object], *, launched_at: float | None = None, now: float | None = None
) -> list[tuple[str, float, bool]]:
    """[(group, seconds, still running)] for the groups this node has reached, in order."""
    now = time.time() if now is None else now
    out: list[tuple[str, float, bool]] = []
    for group, names in GROUPS:
        parts = [p for p in (_seconds(stages.get(n), now) for n in names) if p is not None]
        if group == "boot" and launched_at is not None:
            first = stages.get("preflight")
            if isinstance(first, Mapping) and isinstance(first.get("start"), (int, float)):
                parts.append((max(0.0, float(first["start"]) - launched_at), False))
        if parts:
            out.append((group, sum(p[0] for p in parts), any(p[1] for p in parts)))
    return out


def human(seconds: float) -> str:
    """75 -> "1m15s", 3725 -> "1h02m", 4 -> "4s"."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def format_timeline(stages: Mapping[str, object], *, launched_at: float | None = None, now: float | None = None) -> str:
    """One line, e.g. "boot 1m41s · stack 2m03s · fetch 3s · run 12m00s (running)"; "" when nothing started."""
    items = stage_groups(stages, launched_at=launched_at, now=now)
    return " · ".join(f"{g} {human(s)}" + (" (running)" if running else "") for g, s, running in items)


def format_nodes(
    statuses: Sequence[Mapping[str, object] | None], *, launched_at: float | None = None, now: float | None = None
) -> list[str]:
    """One "node N: ..." line per node with a status document (the `status` view and run summary)."""
    lines = []
    for rank, st in enumerate(statuses):
        stages = (st or {}).get("stages")
        if isinstance(stages, Mapping):
            text = format_timeline(stages, launched_at=launched_at, now=now) + copy_progress(st or {})
            if text:
                lines.append(f"node {rank}: {text}")
    return lines


def copy_progress(status: Mapping[str, object]) -> str:
    """ " (inputs 412/2000 files, 61.8/300.0 MB)" while the node copies its inputs, else ""."""
    stages, done = status.get("stages"), status.get("inputs")
    stage = stages.get("inputs") if isinstance(stages, Mapping) else None
    if not isinstance(stage, Mapping) or stage.get("end") is not None or not isinstance(done, Mapping):
        return ""
    try:
        files, of, got, total = (int(done[k]) for k in ("files", "of", "bytes", "of_bytes"))
    except (KeyError, TypeError, ValueError):
        return ""
    return f" (inputs {files}/{of} files, {got / 1e6:.1f}/{total / 1e6:.1f} MB)"


def format_phases(phases: Mapping[str, float]) -> str:
    """The timeline line of a finished run from its stored per-stage seconds (`Store.phases`, the
    slowest node's per stage); "" when no VM stage was recorded."""
    stages = {
        name: {"start": 0.0, "end": float(secs)} for name, secs in phases.items() if isinstance(secs, (int, float))
    }
    return format_timeline(stages, now=0.0)
