"""Checkpoints (docs/SPOT.md): rank 0 uploads the job's checkpoint folder to the older of two
slots, data first, then its record `<seq> <sha256> <bytes> end`; a restore takes the newest slot
whose data matches its record and unpacks safely, falling back to the other slot, so an upload cut
short by the end of the machine is never restored. Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path
from typing import Callable, Optional, Tuple

from gpucloud.vm import protocol
from gpucloud.vm.agent.artifacts import sha256_file
from gpucloud.vm.agent.private import private_tree
from gpucloud.vm.agent.safe_extract import Refused, safe_untar
from gpucloud.vm.agent.status import write_atomic
from gpucloud.vm.agent.transfer import Transfer

SLOTS = 2


def folder_signature(folder: Path) -> str:
    """Names, sizes and mtimes: an unchanged folder is not uploaded again."""
    rows = []
    for root, _dirs, files in os.walk(folder):
        for name in files:
            p = Path(root) / name
            try:
                st = p.stat()
            except OSError:
                continue
            rows.append(f"{p.relative_to(folder)} {st.st_size} {st.st_mtime}")
    return "\n".join(sorted(rows))


class Checkpoints:
    def __init__(
        self,
        folder: Path,
        vm_dir: Path,
        st_dir: Path,
        manifest: protocol.Manifest,
        transfer: Transfer,
        rank: int,
        log: Callable[[str], None],
    ) -> None:
        self.folder = folder
        self.vm_dir = vm_dir
        self.state_path = st_dir / "ckpt"
        self.manifest = manifest
        self.transfer = transfer
        self.rank = rank
        self.log = log
        self.enabled = False  # after the restore: before it, the folder is not the job's yet
        self.signature = ""

    def _state(self) -> Tuple[int, int]:
        try:
            slot, seq = (int(x) for x in self.state_path.read_text().split())
            return slot, seq
        except (OSError, ValueError):
            return 1, 0

    def _set_state(self, slot: int, seq: int) -> None:
        write_atomic(self.state_path, f"{slot} {seq}".encode())

    def has_urls(self) -> bool:
        return all(self.manifest.ranked_url("ckpt_get", s) for s in range(SLOTS))

    def upload(self, why: str) -> bool:
        """Upload the folder if it changed; True when there was nothing to do or it went up."""
        if not self.enabled or self.rank != 0 or not self.folder.is_dir() or not any(self.folder.iterdir()):
            return True
        sig = folder_signature(self.folder)
        if sig == self.signature:
            return True
        slot, seq = self._state()
        slot, seq = 1 - slot, seq + 1
        data = self.vm_dir / "ckpt.tgz"
        try:
            with tarfile.open(data, "w:gz") as tar:
                tar.add(str(self.folder), arcname=".")
        except (OSError, tarfile.TarError) as exc:
            self.log(
                f"checkpoint {seq} not uploaded: the folder changed while it was packed ({exc.__class__.__name__})"
            )
            return False
        size = data.stat().st_size
        record = self.vm_dir / "ckpt.sum"
        record.write_bytes(protocol.checkpoint_record(seq, sha256_file(data), size))
        if not self.transfer.put_file(
            self.manifest.ranked_url("ckpt_put", slot), data, max_time=3600
        ) or not self.transfer.put_file(self.manifest.ranked_url("ckpt_sum_put", slot), record):
            self.log(f"checkpoint {seq} upload failed")
            return False
        self._set_state(slot, seq)
        self.signature = sig
        self.log(f"checkpoint {seq} uploaded ({why}, {size} bytes)")
        return True

    def records(self) -> list:
        out = []
        for slot in range(SLOTS):
            body = self.transfer.get(self.manifest.ranked_url("ckpt_sum_get", slot), max_time=60)
            text = body.decode("utf-8", "replace") if body else ""
            out.append((slot, text, protocol.parse_checkpoint_record(text)))
        return out

    def restore(self) -> Optional[int]:
        """Unpack the newest valid slot into the folder; its seq, or None (the job starts fresh)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self._set_state(1, 0)
        records = self.records()

        def seq_of(item: tuple) -> int:
            text = item[1].split()
            return int(text[0]) if text and text[0].isdigit() else 0

        for slot, text, rec in sorted(records, key=seq_of, reverse=True):
            if not text:
                continue
            if rec is None:
                self.log(f"checkpoint slot {slot}: incomplete record, skipped")
                continue
            data = self.vm_dir / "ckpt.tgz"
            if not self.transfer.get_file(self.manifest.ranked_url("ckpt_get", slot), data, retries=5):
                self.log(f"checkpoint {rec.seq}: download failed")
                continue
            if sha256_file(data) != rec.sha256:
                self.log(f"checkpoint {rec.seq} is torn (its upload was cut short): not restored")
                continue
            try:
                safe_untar(data, self.folder)
            except Refused as exc:
                self.log(f"checkpoint {rec.seq} not restored: {exc}")
                continue
            private_tree(self.folder)  # the members' modes are set past the umask
            self._set_state(slot, rec.seq)
            self.signature = folder_signature(self.folder)
            self.log(f"checkpoint {rec.seq} restored into {self.folder.name} ({rec.size} bytes)")
            return rec.seq
        self.log("no checkpoint to restore: the job starts fresh")
        return None
