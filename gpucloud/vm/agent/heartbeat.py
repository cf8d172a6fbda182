"""The heartbeat: status.json re-sent at least every heartbeat interval, with a disk check (a full
disk is logged once and named in the final status). Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Callable

from gpucloud.vm.agent.status import StatusBoard

DISK_FULL_KIB = 1024


def free_kib(folder: Path) -> int:
    """KiB free where the work folder is (`df -Pk`, as on every image); -1 when unknown."""
    try:
        out = subprocess.run(["df", "-Pk", str(folder)], capture_output=True, text=True, timeout=10, check=False)
        return int(out.stdout.splitlines()[1].split()[3])
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return -1


class Heartbeat:
    def __init__(
        self,
        board: StatusBoard,
        folder: Path,
        interval: float,
        log: Callable[[str], None],
        free: Callable[[Path], int] = free_kib,
    ) -> None:
        self.board = board
        self.folder = folder
        self.interval = interval
        self.log = log
        self.free = free
        self.last = 0.0

    def disk_check(self) -> None:
        avail = self.free(self.folder)
        if 0 <= avail < DISK_FULL_KIB and not self.board.get("disk_full"):
            self.board.set(disk_full=True)
            self.log(
                f"WARNING: the VM's disk is full ({avail} KiB free in {self.folder}): "
                "the job's output may be incomplete"
            )

    def sent(self, now: float) -> None:
        """A status went up for another reason (a log part): the next beat counts from now."""
        self.last = now

    def step(self, now: float) -> bool:
        if now - self.last < self.interval:
            return False
        self.disk_check()
        self.board.push()
        self.last = now
        return True
