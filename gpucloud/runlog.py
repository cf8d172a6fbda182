"""The CLI's own copy of a run's log: `GPUCLOUD_HOME/runs/<id>/log.txt`, mirrored from the channel's
log parts as they arrive, so `gpucloud logs` works after teardown (or with the channel gone).

Several processes may mirror the same run at once (the `run` that follows it and a `logs --follow`
in another terminal): appends happen under an exclusive file lock, each part exactly once, and every
reader prints from its own byte offset of the file, so nobody misses or repeats a line.
Multi-node runs prefix each line with its rank; single-node logs are the job's bytes, untouched.
"""

from __future__ import annotations

import base64
import fcntl
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpucloud.channel import Channel

LOG_FILE = "log.txt"
INDEX_FILE = "log.json"


def run_dir(home: Path, run_id: str) -> Path:
    return home / "runs" / run_id


def line_prefix(rank: int, num_nodes: int) -> bytes:
    """The hook for multi-node output: which node printed a line."""
    return b"" if num_nodes <= 1 else f"[node {rank}] ".encode()


class LogMirror:
    """Appends new channel log parts to log.txt and hands each caller the bytes it has not seen."""

    def __init__(self, home: Path, run_id: str, num_nodes: int = 1) -> None:
        self.dir = run_dir(home, run_id)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / LOG_FILE
        self.index_path = self.dir / INDEX_FILE
        self.run_id = run_id
        self.num_nodes = num_nodes
        self.offset = 0  # how much of log.txt this reader has handed out
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
        return {"parts": parts, "pending": pending, "closed": bool(doc.get("closed"))}

    def _save_index(self, doc: dict) -> None:
        tmp = self.index_path.with_name(INDEX_FILE + ".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.index_path)

    def sync(self, channel: Channel, *, final: bool = False) -> int:
        """Fetch every complete part not yet mirrored; with `final`, also flush partial lines of
        multi-node logs. Returns how many parts were added."""
        added = 0
        with open(self.dir / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                doc = self._load_index()
                out = bytearray()
                for rank in range(self.num_nodes):
                    parts = channel.read_log_parts(self.run_id, rank, doc["parts"][rank])
                    if not parts and not (final and doc["pending"][rank]):
                        continue
                    data = b"".join(parts)
                    doc["parts"][rank] += len(parts)
                    added += len(parts)
                    prefix = line_prefix(rank, self.num_nodes)
                    if not prefix:
                        out += data
                        continue
                    buf = base64.b64decode(doc["pending"][rank]) + data
                    cut = buf.rfind(b"\n") + 1
                    done, rest = buf[:cut], buf[cut:]
                    if final and rest:
                        done, rest = buf + b"\n", b""
                    for line in done.splitlines(keepends=True):
                        out += prefix + line
                    doc["pending"][rank] = base64.b64encode(rest).decode()
                if out:
                    with open(self.path, "ab") as f:
                        f.write(out)
                if out or added:
                    self._save_index(doc)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        return added

    def restart(self) -> None:
        """A new attempt of the run (spot recovery) writes its log parts from 0 again: mirror them
        from there, after what the earlier attempts left in log.txt."""
        with open(self.dir / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                self._save_index({"parts": [0] * self.num_nodes, "pending": [""] * self.num_nodes, "closed": False})
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def read_new(self) -> bytes:
        """Bytes of log.txt this reader has not returned yet."""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        return data
