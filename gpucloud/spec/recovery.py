"""The job file's spot-recovery fields: `checkpoint`, `checkpoint_interval` and `recovery`
(docs/SPOT.md). Kept apart from spec_models so the core job model stays readable."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpucloud.spec.values import describe, parse_duration, refuse_bool, reject, required_text

RECOVERY_EVENTS = ("preemption", "capacity", "lost")
DEFAULT_CHECKPOINT_INTERVAL_S = 600
MAX_RESTARTS = 100


Trigger = Literal["preemption", "capacity", "lost"]


def _preemption_only() -> list[Trigger]:
    return ["preemption"]


class Recovery(BaseModel):
    """`recovery: {on: [preemption, capacity, lost], max_restarts: N, fallback: on-demand | none}`.

    on: what starts a new attempt (preemption: the cloud's notice or `gpucloud preempt`; lost: a
    machine gone without a final status; capacity: no candidate had capacity for a relaunch, so
    the failover order is tried again after a pause). max_restarts: new attempts at most.
    fallback on-demand: the restart after the max_restarts-th preemption goes to on-demand."""

    model_config = ConfigDict(extra="forbid")
    on: list[Trigger] = Field(default_factory=_preemption_only)
    max_restarts: int = Field(3, ge=0, le=MAX_RESTARTS)
    fallback: Literal["on-demand", "none"] = "none"

    @field_validator("on", mode="before")
    @classmethod
    def _on(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value:
            reject(f"expected a list of {', '.join(RECOVERY_EVENTS)}, got {describe(value)}")
        for item in value:
            if item not in RECOVERY_EVENTS:
                reject(
                    f"{describe(item)} is not an event to recover from. Expected some of {', '.join(RECOVERY_EVENTS)}"
                )
        return list(dict.fromkeys(value))

    @field_validator("max_restarts", mode="before")
    @classmethod
    def _max_restarts(cls, value: Any) -> Any:
        return refuse_bool(value)

    @field_validator("fallback", mode="before")
    @classmethod
    def _fallback(cls, value: Any) -> Any:
        if value is None or value is False:
            return "none"
        if isinstance(value, str) and value.strip().lower() in ("on-demand", "ondemand", "on_demand"):
            return "on-demand"
        if isinstance(value, str) and value.strip().lower() == "none":
            return "none"
        reject(f"{describe(value)} is not a fallback. Expected on-demand or none")


def checkpoint_path(value: Any) -> str | None:
    """`checkpoint: DIR`: a folder relative to the job's working folder (the same rules as an artifact)."""
    if value is None:
        return None
    text = required_text(value, "a folder relative to the job's working folder, e.g. checkpoints/")
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        reject("contains a control character. Expected a plain folder name, e.g. checkpoints/")
    if text.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:[\\/]", text):
        reject(
            f"'{text}' is an absolute path. The checkpoint folder is relative to the job's working folder, "
            "e.g. checkpoints/"
        )
    if ".." in re.split(r"[\\/]+", text):
        reject(f"'{text}' leaves the working folder with '..'. Use a folder inside it, e.g. checkpoints/")
    return text.rstrip("/") or "."


def checkpoint_interval(value: Any) -> int:
    """`checkpoint_interval`: a duration (10m, 90s, or whole seconds), at least 1 s."""
    seconds = parse_duration(value)
    if seconds < 1:
        reject(f"{describe(value)} is shorter than 1 s. Expected e.g. 10m or 90s")
    return seconds
