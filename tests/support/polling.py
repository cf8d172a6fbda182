"""Waiting for a condition another process or thread brings about, with a bound."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(cond: Callable[[], object], timeout: float = 30.0, step: float = 0.1) -> bool:
    """Whether `cond()` came true within `timeout` seconds (checked every `step`, and once at the end)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return bool(cond())
