"""The log pump: job.log's new bytes go up as numbered parts (at most LOG_PART_MAX each) through
the node's log grant, paced so an append blob's blocks last until the deadline.

A part that failed is sent again unchanged (same index, offset and bytes): an append never mixes
two versions of a part. The position (`index start end`) is kept in st/logpos so a boot after a
reboot and the backstop go on from it. Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Tuple

from gpucloud.vm import protocol
from gpucloud.vm.agent.status import StatusBoard, write_atomic
from gpucloud.vm.agent.uploads import LogUpload

NOTHING, SENT, FAILED, MORE = "nothing", "sent", "failed", "more"


class LogPump:
    def __init__(self, log_path: Path, st_dir: Path, board: StatusBoard, upload: LogUpload, part_max: int) -> None:
        self.log_path = log_path
        self.pos_path = st_dir / "logpos"
        self.part_path = st_dir.parent / f"part.{os.getpid()}"  # the local provider drops part.* at teardown
        self.board = board
        self.upload = upload
        self.part_max = part_max
        self.last_sent = 0.0

    def position(self) -> Tuple[int, int, int]:
        try:
            i, po, pe = (int(x) for x in self.pos_path.read_text().split())
            return i, po, pe
        except (OSError, ValueError):
            return 0, 0, 0

    def _save(self, i: int, po: int, pe: int) -> None:
        write_atomic(self.pos_path, f"{i} {po} {pe}".encode())

    def flush(self, final: bool = False) -> str:
        """Send one part: SENT, NOTHING (nothing new or no grant), FAILED, or MORE (final: more to send)."""
        with self.board.exclusive():
            if not final and self.board.ended_elsewhere():
                return NOTHING
            return self._flush(final)

    def _flush(self, final: bool) -> str:
        i, po, pe = self.position()
        try:
            size = os.path.getsize(self.log_path)
        except OSError:
            size = 0
        if pe <= po:
            if size <= po or not self.upload.usable:
                return NOTHING
            pe = min(size, po + self.part_max)
            self._save(i, po, pe)
        if i >= self.upload.max_parts + protocol.APPEND_RESERVED_BLOCKS:
            return FAILED
        with open(self.log_path, "rb") as src:
            src.seek(po)
            self.part_path.write_bytes(src.read(pe - po))
        if not self.upload.part(self.part_path, i, po, max_time=60 if final else 30, hard=final):
            return FAILED
        try:
            self.part_path.unlink()  # one copy of the log on the machine (the local provider's disk)
        except OSError:
            pass
        i += 1
        self._save(i, pe, pe)
        self.board.set(log_parts=i, log_bytes=pe)
        return MORE if final and size > pe else SENT

    def drain(self) -> None:
        """The final flush: every byte left, part after part, until one fails."""
        while self.flush(final=True) == MORE:
            pass

    def gap(self, now: float, deadline: float, interval: float) -> float:
        """Seconds between parts: the interval, or longer when the grant's parts would not last."""
        i = self.position()[0]
        left = max(1, self.upload.max_parts - i)
        return max(interval, (deadline - now) / left)

    def step(self, now: float, deadline: float, interval: float, push: Callable[[], object]) -> bool:
        """One pump tick: a part when due; True when one went up (and the status was pushed)."""
        if now - self.last_sent < self.gap(now, deadline, interval):
            return False
        self.last_sent = now
        if self.flush() == SENT:
            push()
            return True
        return False
