"""The node's status document: one board every thread writes through, pushed whole at each stage
change and heartbeat (gpucloud/vm/protocol.py defines its bytes).

The board is also kept on disk (`st/board.json`, replaced atomically) so the backstop process and
a boot after a reboot see the same fields. A final status is signed by the node's own key
(claim.py) before it goes up. Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional

from gpucloud.vm import protocol

CLAIM_WAIT_S = 30.0


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class StatusBoard:
    """status.json's fields; `push` uploads them (the final push signs and tries hard)."""

    def __init__(
        self,
        run_id: str,
        rank: int,
        st_dir: Path,
        now: Callable[[], float],
        upload: Callable[[Path, bool], bool],
        sign: Optional[Callable[[bytes], Optional[str]]] = None,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.run_id = run_id
        self.rank = rank
        self.st_dir = st_dir
        self._now = now
        self._upload = upload
        self.sign = sign
        self._log = log
        self.lock = threading.RLock()
        self.fields: Dict[str, Any] = {
            "state": "booting",
            "stage": "preflight",
            "stages": {},
            "exit_code": None,
            "message": "",
            "log_parts": 0,
            "log_bytes": 0,
            "artifacts_sha256": "",
            "open": "",
        }
        # Set by the agent: True once another process (watchdog, backstop) ends the run; from
        # then on this process sends no progress status that could land after that final one.
        self.ended_elsewhere: Callable[[], bool] = lambda: False

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """One upload of status or log at a time across the node's processes (an flock)."""
        with open(self.st_dir / "push.lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # ---- persistence -----------------------------------------------------------------------------
    @property
    def board_path(self) -> Path:
        return self.st_dir / "board.json"

    def save(self) -> None:
        with self.lock:
            write_atomic(self.board_path, json.dumps(self.fields).encode())

    def load(self) -> bool:
        """The fields saved before (backstop, reboot); False when there are none."""
        try:
            data = json.loads(self.board_path.read_text())
        except (OSError, ValueError):
            return False
        with self.lock:
            self.fields.update(data)
        return True

    # ---- fields ------------------------------------------------------------------------------------
    def set(self, **values: Any) -> None:
        with self.lock:
            self.fields.update(values)
            self.save()

    def get(self, name: str) -> Any:
        with self.lock:
            return self.fields.get(name)

    def begin_stage(self, name: str, start: Optional[float] = None) -> None:
        """Close the open stage (ok) and open `name`."""
        with self.lock:
            self.end_open(True)
            t = int(self._now() if start is None else start)
            self.fields["stages"][name] = {"start": t, "end": None, "ok": None}
            self.fields["open"] = name
            self.fields["stage"] = name
            self.save()

    def end_stage(self, name: str, ok: bool) -> None:
        with self.lock:
            entry = self.fields["stages"].get(name)
            if entry is not None:
                entry["end"] = int(self._now())
                entry["ok"] = ok
            if self.fields.get("open") == name:
                self.fields["open"] = ""
            self.save()

    def end_open(self, ok: bool) -> None:
        with self.lock:
            if self.fields.get("open"):
                self.end_stage(self.fields["open"], ok)

    def set_final(self, state: str, exit_code: Optional[int], message: str) -> None:
        """The end: the open stage closed, `done` marked, the final fields set."""
        with self.lock:
            self.end_open(state in ("succeeded", "failed"))
            t = int(self._now())
            self.fields["stages"]["done"] = {"start": t, "end": t, "ok": True}
            self.fields.update(state=state, exit_code=exit_code, message=message, stage="done")
            self.fields.pop("kept", None)  # whoever ends the machine (watchdog, backstop, signal) ends its keep
            self.save()

    def is_final(self) -> bool:
        return self.get("state") in protocol.FINAL_STATES

    # ---- the document --------------------------------------------------------------------------------
    def document(self) -> bytes:
        with self.lock:
            f = self.fields
            return protocol.status_document(
                run_id=self.run_id,
                rank=self.rank,
                state=f["state"],
                stage=f["stage"],
                stages=f["stages"],
                heartbeat=int(self._now()),
                exit_code=f["exit_code"],
                message=f["message"],
                log_parts=int(f["log_parts"]),
                log_bytes=int(f["log_bytes"]),
                artifacts_sha256=f["artifacts_sha256"],
                gpu=f.get("gpu"),
                inputs=f.get("inputs"),
                job=int(f.get("job") or 0),
                kept=f.get("kept"),
            )

    def push(self, final: bool = False) -> bool:
        """Upload the document now (a final one signed, tried hard); False when the upload failed
        or was skipped (a progress status after another process ended the run)."""
        with self.exclusive():
            if not self.is_final() and self.ended_elsewhere():
                return False
            with self.lock:
                raw = self.document()
                final_doc = self.is_final()
            if final_doc and self.sign is not None:
                sig = self.sign(raw)
                if sig:
                    raw = protocol.signed_status(raw, sig)
            path = self.st_dir / f"out.{os.getpid()}.{threading.get_ident()}"
            path.write_bytes(raw)
            ok = self._upload(path, final)
        if not ok:
            self._log("status upload failed")
        return ok
