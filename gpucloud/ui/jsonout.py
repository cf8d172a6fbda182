"""Machine-readable answers on every exit path, and quiet exits on closed pipes.

With `--json`, a command prints exactly one JSON document on stdout, also when it fails:
`{"error": {"exit_code", "kind", "message", "hint", "details"}}` (README, "JSON output").
`details` is a list: for a job file, one `{"file", "line", "field", "message"}` per problem; for a
failover, one `{"attempt": ...}` line per candidate tried; for a configuration error, one
`{"cloud_reason": ...}` per cloud. A closed stdout (`gpucloud plan --json | head -1`) ends the
command quietly with exit 141 (128 + SIGPIPE), never as an internal error.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

from gpucloud.errors import GpucloudError, error_kind

BROKEN_PIPE_EXIT = 141


def finite(doc: object) -> object:
    """The document with every NaN or infinity replaced by null: JSON has no such numbers, and a
    reader of `--json` must never get a bare `NaN`."""
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [finite(v) for v in doc]
    return doc


def dumps(doc: object, indent: int | None = 2) -> str:
    """Strict JSON text of a document (no NaN/Infinity: json.dumps(allow_nan=False))."""
    return json.dumps(finite(doc), indent=indent, default=str, allow_nan=False)


def emit(doc: object) -> None:
    """One JSON document on stdout, flushed (a BrokenPipeError goes up to `quiet_broken_pipe`)."""
    sys.stdout.write(dumps(doc) + "\n")
    sys.stdout.flush()


def error_details(exc: BaseException) -> list[dict[str, Any]]:
    """The structured parts of an error: job-file issues, failover attempts, per-cloud reasons."""
    from gpucloud.ui.ci import error_details as issue_details

    issues = issue_details(exc)
    if issues:
        return issues
    attempts = getattr(exc, "attempts", None)
    if attempts:
        return [{"attempt": a} for a in attempts]
    reasons = getattr(exc, "reasons", None)
    if reasons:
        return [{"cloud_reason": r} for r in reasons]
    return []


def error_document(exc: BaseException, exit_code: int | None = None) -> dict[str, Any]:
    """The --json document of a failure."""
    if isinstance(exc, GpucloudError):
        return {
            "error": {
                "exit_code": exit_code if exit_code is not None else exc.exit_code,
                "kind": error_kind(exc),
                "message": exc.message,
                "hint": exc.hint,
                "details": error_details(exc),
            }
        }
    return {
        "error": {
            "exit_code": exit_code if exit_code is not None else 70,
            "kind": "internal",
            "message": f"{type(exc).__name__}: {exc}",
            "hint": "GPUCLOUD_DEBUG=1 shows the traceback; please report it.",
            "details": [],
        }
    }


def simple_error(exit_code: int, kind: str, message: str, hint: str | None = None) -> dict[str, Any]:
    """An error document for an exit that has no exception (interrupted, a click usage error)."""
    return {"error": {"exit_code": exit_code, "kind": kind, "message": message, "hint": hint, "details": []}}


def quiet_broken_pipe() -> None:
    """After a BrokenPipeError: point stdout at /dev/null so the interpreter's final flush does
    not fail again (Python prints "Exception ignored ... BrokenPipeError" otherwise)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def wants_json(argv: list[str]) -> bool:
    """Whether the command line asked for --json (for errors raised before the command runs)."""
    return "--json" in argv
