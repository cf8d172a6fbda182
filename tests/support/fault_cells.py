"""The cells of a fault matrix (call x error kind), pairwise where two kinds take one path.

Throttling and a cloud-side failure (HTTP 5xx) take the same path in both providers: retried with
backoff, then a ThrottledError (AWS: errors.is_transient and errors.classify; Azure: the SDK's
retry policy and errors.classify_error). A cell for each of the two at every call repeats that path,
so each call gets one of them, in turn: both codes are still injected, at half the calls each, and
every other kind at every call (the full product).
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

SAME_PATH = ("throttle", "generic")  # the kinds whose cells alternate over the calls


def cells(calls: Iterable[str], kinds: Iterable[str]) -> list[tuple[str, str]]:
    """(call, kind) for every kind at every call, except that the SAME_PATH kinds take turns."""
    kinds = list(kinds)
    return [
        (call, kind)
        for i, call in enumerate(calls)
        for kind in kinds
        if kind not in SAME_PATH or kind == SAME_PATH[i % len(SAME_PATH)]
    ]


def params(calls: Iterable[str], kinds: Iterable[str]) -> list[object]:
    """`cells` as pytest params with the ids a full product would give them (`call-kind`)."""
    return [pytest.param(call, kind, id=f"{call}-{kind}") for call, kind in cells(calls, kinds)]
