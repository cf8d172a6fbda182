"""How the node writes a log part or its claim, chosen by the log grant in its manifest (file
folder, S3 presigned POST, Azure append blob): one small class per style, none in the core.

Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from gpucloud.vm import protocol
from gpucloud.vm.agent.transfer import Transfer


class LogUpload:
    """No grant (no manifest): nothing can be sent."""

    style = ""
    max_parts = protocol.UNLIMITED_PARTS

    def __init__(self, grant: protocol.LogGrant, transfer: Transfer) -> None:
        self.grant = grant
        self.transfer = transfer

    @property
    def usable(self) -> bool:
        return bool(self.grant.url)

    def part(self, path: Path, index: int, offset: int, *, max_time: float, hard: bool) -> bool:
        return False

    def claim(self, path: Path, name: str) -> bool:
        return False


class DirUpload(LogUpload):
    """A folder URL (file, ssh): part i is `URL/<i:06d>`; the claim `URL/claim-<fp>`."""

    style = "dir"

    def part(self, path: Path, index: int, offset: int, *, max_time: float, hard: bool) -> bool:
        url = f"{self.grant.url}/{protocol.log_part_name(index)}"
        return self.transfer.put_file(url, path, max_time=max_time, hard=hard)

    def claim(self, path: Path, name: str) -> bool:
        return self.transfer.put_file(f"{self.grant.url}/{name}", path, hard=True)


class PostUpload(LogUpload):
    """One S3 presigned POST whose policy admits any key under the node's log prefix."""

    style = "post"

    def part(self, path: Path, index: int, offset: int, *, max_time: float, hard: bool) -> bool:
        key = self.grant.key_prefix + protocol.log_part_name(index)
        return self.transfer.post_form(self.grant.url, self.grant.fields, key, path, max_time=max_time, hard=hard)

    def claim(self, path: Path, name: str) -> bool:
        return self.transfer.post_form(self.grant.url, self.grant.fields, self.grant.key_prefix + name, path, hard=True)


class AppendUpload(LogUpload):
    """An Azure append blob: a part is one Append Block at its byte offset (412 = it landed before)."""

    style = "append"
    max_parts = protocol.APPEND_PACED_BLOCKS

    def part(self, path: Path, index: int, offset: int, *, max_time: float, hard: bool) -> bool:
        return self.transfer.append_block(self.grant.url, path, offset, max_time=max_time, hard=hard)


STYLES = {"dir": DirUpload, "post": PostUpload, "append": AppendUpload}


def log_upload(grant: protocol.LogGrant, transfer: Transfer) -> LogUpload:
    return STYLES.get(grant.style, LogUpload)(grant, transfer)


def claim_append(url: str, transfer: Transfer, path: Path) -> Optional[bool]:
    """Azure's claim blob (manifest `claim_append`): one appended line; None when there is none."""
    if not url:
        return None
    return transfer.append_block(url, path, None, hard=True)
