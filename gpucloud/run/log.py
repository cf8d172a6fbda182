"""The CLI's own copy of a run's log: `GPUCLOUD_HOME/runs/<id>/log.txt`, mirrored from the channel's
log parts as they arrive, so `gpucloud logs` works after teardown (or with the channel gone).

Several processes may mirror the same run at once (the `run` that follows it and a `logs --follow`
in another terminal): appends happen under an exclusive file lock, each part exactly once, and every
reader prints from its own byte offset of the file, so nobody misses or repeats a line.
Multi-node runs prefix each line with its rank; single-node logs are the job's bytes, untouched.

The index (log.json) keeps each node's position in the channel's log: a part index, or a byte
offset where the backend keeps the log as one append blob (Azure); `Channel.iter_log` says which.

Bounded: parts are fetched and appended one at a time (the CLI holds one part, never the
log), and the copy is capped at GPUCLOUD_LOG_CAP bytes (default 1 GiB; suffixes K, M, G). The first
half of the cap stays in log.txt; past it, bytes go to two rotating tail files of a quarter each, so
the last quarter to half of the cap is kept. When the run ends, log.txt gets a note saying how
many bytes were dropped, then the tail. While the tail is being kept, the live view pauses.
One copy: once the final sync has a node's parts, a store on this machine's disk (the local
provider's file channel) drops them, and the local provider's teardown drops the node's own job.log.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpucloud.channel.run_objects import Channel

LOG_FILE = "log.txt"
INDEX_FILE = "log.json"
TAIL_FILES = ("log.tail.0", "log.tail.1")  # older, newer
CAP_ENV = "GPUCLOUD_LOG_CAP"
DEFAULT_CAP = 1 << 30
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def log_cap(value: str | None = None) -> int:
    """The log cap in bytes from GPUCLOUD_LOG_CAP ("1G", "200M", "65536"); the default when unset
    or unreadable (a bad setting must not cost the user the log)."""
    text = (os.environ.get(CAP_ENV, "") if value is None else value).strip().upper().removesuffix("B").removesuffix("I")
    match = re.fullmatch(r"(\d+)\s*([KMG]?)", text)
    if not match:
        return DEFAULT_CAP
    return max(4096, int(match.group(1)) * _UNITS[match.group(2)])


def run_dir(home: Path, run_id: str) -> Path:
    return home / "runs" / run_id


def line_prefix(rank: int, num_nodes: int) -> bytes:
    """The hook for multi-node output: which node printed a line."""
    return b"" if num_nodes <= 1 else f"[node {rank}] ".encode()


class LogMirror:
    """Appends new channel log parts to log.txt and hands each caller the bytes it has not seen."""

    def __init__(self, home: Path, run_id: str, num_nodes: int = 1, cap: int | None = None) -> None:
        self.dir = run_dir(home, run_id)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / LOG_FILE
        self.index_path = self.dir / INDEX_FILE
        self.run_id = run_id
        self.num_nodes = num_nodes
        self.offset = 0  # how much of log.txt this reader has handed out
        self.cap = log_cap() if cap is None else cap
        self.path.touch(exist_ok=True)

    def _load_index(self) -> dict:
        try:
            doc = json.loads(self.index_path.read_text())
        except (OSError, ValueError):
            doc = {}
        parts = list(doc.get("parts") or [])
        pending = list(doc.get("pending") or [])
        parts += [0] * (self.num_nodes - len(parts))
        pending += [""] * (self.num_nodes - len(pending))
        return {
            "parts": parts,
            "pending": pending,
            "closed": bool(doc.get("closed")),
            "dropped": int(doc.get("dropped") or 0),
            "capped": bool(doc.get("capped")),
        }

    def _save_index(self, doc: dict) -> None:
        tmp = self.index_path.with_name(INDEX_FILE + ".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.index_path)

    def sync(self, channel: Channel, *, final: bool = False) -> int:
        """Fetch every complete piece not yet mirrored; with `final`, also flush partial lines of
        multi-node logs and close a capped log (note + tail). Returns how many pieces were added."""
        added = 0
        with open(self.dir / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                doc = self._load_index()
                for rank in range(self.num_nodes):
                    prefix = line_prefix(rank, self.num_nodes)
                    for data, position in channel.iter_log(self.run_id, rank, doc["parts"][rank]):
                        doc["parts"][rank] = position
                        added += 1
                        self._append(doc, self._prefixed(doc, rank, prefix, data, final=False))
                    if final and doc["pending"][rank]:
                        self._append(doc, self._prefixed(doc, rank, prefix, b"", final=True))
                if final and doc["capped"]:
                    self._close_cap(doc)
                if added or final:
                    self._save_index(doc)
                if final:
                    for rank in range(self.num_nodes):
                        channel.release_log_parts(self.run_id, rank, doc["parts"][rank])
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        return added

    def note(self, text: str) -> None:
        """Append one `[gpucloud]` line of the CLI's own (the run's verdict when the CLI, not the
        machine, ended it); it starts on a line of its own."""
        with open(self.dir / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with open(self.path, "rb+") as f:
                    size = f.seek(0, os.SEEK_END)
                    if size:
                        f.seek(size - 1)
                    start = b"\n" if size and f.read(1) != b"\n" else b""
                    f.seek(0, os.SEEK_END)
                    f.write(start + f"[gpucloud] {text}\n".encode())
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def restart(self) -> None:
        """A new attempt of the run (spot recovery) writes its log parts from 0 again: mirror them
        from there, after what the earlier attempts left in log.txt."""
        with open(self.dir / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                doc = self._load_index()
                doc["parts"], doc["pending"] = [0] * self.num_nodes, [""] * self.num_nodes
                self._save_index(doc)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _prefixed(self, doc: dict, rank: int, prefix: bytes, data: bytes, *, final: bool) -> bytes:
        """Multi-node: whole lines with their node's prefix (a partial line waits for its end)."""
        if not prefix:
            return data
        buf = base64.b64decode(doc["pending"][rank]) + data
        cut = buf.rfind(b"\n") + 1
        done, rest = buf[:cut], buf[cut:]
        if final and rest:
            done, rest = buf + b"\n", b""
        doc["pending"][rank] = base64.b64encode(rest).decode()
        return b"".join(prefix + line for line in done.splitlines(keepends=True))

    def _append(self, doc: dict, data: bytes) -> None:
        """Head into log.txt up to half the cap; the rest into the rotating tail files."""
        if not data:
            return
        if not doc["capped"]:
            room = self.cap // 2 - self.path.stat().st_size
            with open(self.path, "ab") as f:
                f.write(data[: max(room, 0)])
            if room >= len(data):
                return
            doc["capped"], data = True, data[max(room, 0) :]
        older, newer = (self.dir / name for name in TAIL_FILES)
        quarter = self.cap // 4
        while data:
            size = newer.stat().st_size if newer.exists() else 0
            with open(newer, "ab") as f:
                f.write(data[: quarter - size])
            data = data[quarter - size :]
            if newer.stat().st_size >= quarter:  # full: it becomes the older one
                doc["dropped"] += older.stat().st_size if older.exists() else 0
                newer.replace(older)

    def _close_cap(self, doc: dict) -> None:
        kept = sum((self.dir / n).stat().st_size for n in TAIL_FILES if (self.dir / n).exists())
        with open(self.path, "ab") as out:
            if doc["dropped"]:
                out.write(
                    f"\n[gpucloud] log cap of {self.cap} bytes ({CAP_ENV}) reached: {doc['dropped']} bytes "
                    f"dropped here; the first {self.cap // 2} and the last {kept} bytes are kept\n".encode()
                )
            for name in TAIL_FILES:
                tail = self.dir / name
                if tail.exists():
                    with open(tail, "rb") as src:
                        while chunk := src.read(1 << 20):
                            out.write(chunk)
                    tail.unlink()
        doc["capped"] = False
        doc["dropped"] = 0
        self.cap = 1 << 62  # closed: later syncs (nothing new) append as is

    def read_new(self, limit: int = -1) -> bytes:
        """Bytes of log.txt this reader has not returned yet (at most `limit`; all with -1)."""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(limit)
        self.offset += len(data)
        return data

    def drain(self, write: Callable[[bytes], object], chunk: int = 8 << 20) -> None:
        """Hand every new byte to `write`, `chunk` bytes at a time: memory stays bounded whatever
        the size of the log (a 2 GB log is printed, never held)."""
        while data := self.read_new(chunk):
            write(data)
