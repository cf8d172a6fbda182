"""The agent's clock: every wait goes through it, so unit tests drive deadlines with a fake one.

Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import threading
import time


class Clock:
    """Wall-clock seconds (epoch) and interruptible waits."""

    def now(self) -> float:
        return time.time()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait up to `seconds` for `event`; True when it is set (a thread told to stop)."""
        return event.wait(max(0.0, seconds))

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))
