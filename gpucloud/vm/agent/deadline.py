"""The watchdog (deadline layer (b)): at the deadline it takes the final gate, stops the job
(SIGTERM, SIGKILL after 5 s) and reports `deadline`. The manifest's `deadline` may lower the
deadline set at boot, never raise it. A deadline the run's max_cost set (the job config's
`deadline_why`) is said as such, and what the job saved goes up first, as on a stop. Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Optional

from gpucloud.vm.agent.status import write_atomic


class Deadline:
    """The run's hard end (epoch seconds), kept in st/deadline for the backstop and a reboot."""

    def __init__(self, st_dir: Path, at: int) -> None:
        self.path = st_dir / "deadline"
        self._lock = threading.Lock()
        self.at = at

    def save(self) -> None:
        write_atomic(self.path, str(self.at).encode())

    @classmethod
    def load(cls, st_dir: Path) -> Optional["Deadline"]:
        try:
            return cls(st_dir, int((st_dir / "deadline").read_text().strip()))
        except (OSError, ValueError):
            return None

    def lower(self, at: Optional[int]) -> bool:
        """Take the manifest's deadline when it is earlier; True when it changed."""
        with self._lock:
            if at is None or at >= self.at:
                return False
            self.at = at
            self.save()
            return True

    def passed(self, now: float) -> bool:
        return now >= self.at

    def remaining(self, now: float) -> float:
        return self.at - now

    def iso(self) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at))


def deadline_why(why: str) -> str:
    """What the deadline is: max_duration, or `why` (the job config's `deadline_why`: the run's
    max_cost, which the CLI turned into this attempt's deadline)."""
    return why or "max_duration passed"


def deadline_message(deadline: Deadline, why: str = "") -> str:
    return f"{deadline_why(why)} (deadline {deadline.iso()})"
