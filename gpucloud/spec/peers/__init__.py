"""`gpucloud import FILE`: a SkyPilot task or a dstack configuration as a gpucloud job file, with a
`# gpucloud import:` comment on every field that has no equivalent (one module per peer).

The result is checked as any job file by the caller's `check` (parse_spec, passed in so that this
package stays below spec/load.py, which imports `peer_kind` for its hint); a value that still fails
there is dropped with the reason as a note, so what is printed always validates."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucloud.errors import UserError
from gpucloud.spec.peers import dstack, skypilot
from gpucloud.spec.peers.common import Draft, read_peer, render, shown
from gpucloud.spec.values import SpecError

_MAX_ROUNDS = 12


@dataclass(frozen=True)
class Imported:
    """The job file text, which peer it came from, and the peer's fields that did not map."""

    text: str
    peer: str
    unmapped: list[str]


def peer_kind(data: Any) -> str | None:
    """ "a SkyPilot task" / "a dstack configuration" when the parsed mapping is one, else None."""
    if not isinstance(data, dict):
        return None
    if dstack.looks_like(data):
        return dstack.PEER
    if skypilot.looks_like(data):
        return skypilot.PEER
    return None


def peer_hint(data: Any, filename: str) -> str | None:
    """The sentence `validate` ends with when a job file is a peer's."""
    kind = peer_kind(data)
    if kind is None:
        return None
    return f"This looks like {kind}: `gpucloud import {filename}` converts it."


def import_file(path: Path, check: Callable[[str], object]) -> Imported:
    """Convert the peer file at `path`; UserError (exit 2) when it is neither peer's."""
    data, _ = read_peer(path)
    name = str(path)
    kind = peer_kind(data)
    if kind is None:
        raise UserError(
            f"{name}: is neither a SkyPilot task nor a dstack configuration, so there is nothing to import.",
            hint="gpucloud import reads a SkyPilot task (resources.accelerators, setup, run, ...) or a dstack "
            "file with type: task (commands, resources.gpu, ...). A gpucloud job file needs no import: "
            f"check it with `gpucloud validate {name}`.",
        )
    draft = Draft(kind, name)
    (dstack if kind == dstack.PEER else skypilot).convert(data, draft)
    text = render(draft, name)
    for _ in range(_MAX_ROUNDS):
        try:
            check(text)
            return Imported(text, kind, list(draft.unmapped))
        except SpecError as exc:
            if not all(_drop(draft, issue.field, issue.message) for issue in exc.issues):
                raise UserError(
                    f"{name}: the converted job file does not validate:\n{exc}",
                    hint="Please report this with the file; meanwhile fix the printed fields by hand.",
                ) from None
        text = render(draft, name)
    raise UserError(f"{name}: the converted job file still does not validate after {_MAX_ROUNDS} rounds.")


def _drop(draft: Draft, field: str, message: str) -> bool:
    """Remove the value `field` (a dotted job-file path) names, noting why; False when it cannot be
    removed (the whole file, or a key every job needs)."""
    top = field.split(".", 1)[0].split("[", 1)[0]
    if top not in draft.job or top in ("name", "run"):
        return False
    holder: dict[str, Any] = draft.job
    key = top
    inner = draft.job[top]
    if isinstance(inner, dict) and field != top:
        sub = next((k for k in inner if field.startswith(f"{top}.{k}")), None)
        if sub is not None:
            holder, key = inner, sub
    value = holder.pop(key)
    if holder is not draft.job and not holder:
        del draft.job[top]
    where = top if top in draft.job else ""
    draft.say(f"{field} {shown(value, 40)} was dropped: {shown(message, 200)}", where)
    if field not in draft.unmapped:
        draft.unmapped.append(field)
    if top == "resources" and not draft.resources.get("gpu") and not draft.resources.get("instance_type"):
        draft.resources["gpu"] = "T4:1"
        draft.say("gpu T4:1 is a placeholder for the GPU that did not convert.", "resources")
    return True
