"""Who ends the run: the first of main, watchdog, guard, signal or backstop to take the final gate
reports the end; the others stand down. The gate is `mkdir W/final` (the backstop is another
process, and a boot after a reboot must see it), behind a lock for the threads.

Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Optional


class FinalGate:
    def __init__(self, vm_dir: Path) -> None:
        self.path = vm_dir / "final"
        self._lock = threading.Lock()
        self.owner: Optional[str] = None
        self.created = False  # this process made W/final
        self.done = threading.Event()  # set once the owner reported the end
        self.exit_code = 1

    def take(self, who: str) -> bool:
        """True for exactly one caller across threads and processes."""
        with self._lock:
            if self.owner is not None and self.owner != who:
                return False
            if not self.created:  # a hold (a signal being decided) has not made the directory
                try:
                    os.mkdir(self.path)
                except OSError:
                    self.owner = "elsewhere"
                    return False
                self.created = True
            self.owner = who
            try:
                (self.path / "owner").write_text(f"{os.getpid()}\n")
            except OSError:
                pass
            return True

    def owner_gone(self) -> bool:
        """The process that took the gate no longer exists (killed while it reported)."""
        try:
            pid = int((self.path / "owner").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        try:  # a zombie (killed, not yet reaped) is gone too
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except (OSError, IndexError):
            return False

    def hold(self, who: str) -> None:
        """Keep every thread of this process from ending the run, without marking it ended on disk
        (a reboot: the boot after it resumes the run)."""
        with self._lock:
            if self.owner is None:
                self.owner = who

    def taken(self) -> bool:
        return self.owner is not None or self.path.exists()

    def elsewhere(self) -> bool:
        """Taken by another process (the watchdog process, the backstop): this one only stands down."""
        return self.owner == "elsewhere" or (self.owner is None and self.path.exists())

    def finished(self, exit_code: int) -> None:
        self.exit_code = exit_code
        self.done.set()
