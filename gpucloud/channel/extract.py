"""Extraction of a tar.gz that came from a machine we do not trust (a job's artifacts).

The member walk is our own and does not rely on tarfile's extraction filters: those were
bypassed by a symlink chain longer than PATH_MAX on CPython before 3.11.13 / 3.12.11 / 3.13.4
(CVE-2025-4517), and gpucloud runs on any Python >= 3.11. Only regular files and folders are
written; no link, device or FIFO is ever created, no mode bit beyond rwx and no owner is taken
from the archive, every path is checked against the destination before it is opened, and files
are opened component by component without following a link. Members are streamed to disk one
chunk at a time. Caps on total bytes, file count and expansion ratio stop a small archive from
filling the disk (docs/SECURITY.md, "Archives and extraction").
"""

from __future__ import annotations

import gzip
import os
import posixpath
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, BinaryIO

GiB = 1024**3
CHUNK = 1024 * 1024
# Environment settings for the caps (docs/SECURITY.md): bytes (suffixes K, M, G, T), a count, a ratio.
ENV_MAX_BYTES = "GPUCLOUD_ARTIFACTS_MAX_BYTES"
ENV_MAX_FILES = "GPUCLOUD_ARTIFACTS_MAX_FILES"
ENV_MAX_RATIO = "GPUCLOUD_ARTIFACTS_MAX_RATIO"
DEFAULT_MAX_BYTES = 50 * GiB
DEFAULT_MAX_FILES = 100_000
DEFAULT_MAX_RATIO = 200.0
# The ratio cap applies only once this much has been expanded: a small file of zeros compresses
# a thousand times over and is harmless; a few hundred MiB of it is not.
RATIO_FLOOR = 64 * 1024 * 1024
_SUFFIX = {"": 1, "K": 1024, "M": 1024**2, "G": GiB, "T": 1024**4}


class CapExceeded(Exception):
    """An extraction cap was reached; the rest of the archive is not extracted."""


@dataclass(frozen=True)
class Caps:
    """Limits of one extraction (per node's archive)."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_files: int = DEFAULT_MAX_FILES
    max_ratio: float = DEFAULT_MAX_RATIO

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Caps:
        """Caps from the environment; a value that does not parse is a UserError naming the variable."""
        from gpucloud.errors import UserError

        env = dict(os.environ if env is None else env)
        values: dict[str, float] = {}
        for name, key, kind in (
            (ENV_MAX_BYTES, "max_bytes", "size"),
            (ENV_MAX_FILES, "max_files", "count"),
            (ENV_MAX_RATIO, "max_ratio", "ratio"),
        ):
            raw = env.get(name, "").strip()
            if not raw:
                continue
            try:
                values[key] = _parse(raw, kind)
            except ValueError:
                raise UserError(
                    f"{name}={raw!r} is not a valid {kind}.",
                    hint=f"Set {name} to a positive number, e.g. {_EXAMPLE[kind]}, or unset it "
                    "for the default (docs/SECURITY.md).",
                ) from None
        return cls(
            max_bytes=int(values.get("max_bytes", DEFAULT_MAX_BYTES)),
            max_files=int(values.get("max_files", DEFAULT_MAX_FILES)),
            max_ratio=float(values.get("max_ratio", DEFAULT_MAX_RATIO)),
        )


_EXAMPLE = {"size": "20G", "count": "50000", "ratio": "100"}


def _parse(raw: str, kind: str) -> float:
    if kind == "size":
        unit = raw[-1:].upper() if raw[-1:].upper() in _SUFFIX and not raw[-1:].isdigit() else ""
        value = float(raw[:-1] if unit else raw) * _SUFFIX[unit]
    else:
        value = float(raw)
    if not value > 0 or value == float("inf") or (kind == "count" and value != int(value)):
        raise ValueError(raw)
    return value


@dataclass
class ArtifactResult:
    """What came back from one node's artifacts: the folder, how many files were extracted, and
    one warning per member that was refused (plus one when a cap stopped the extraction)."""

    dest: Path
    files: int = 0
    bytes: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def refused(self) -> int:
        return len(self.warnings)


def _kind(member: tarfile.TarInfo) -> str | None:
    """Why a member's type is refused, or None for a regular file or folder."""
    if member.issym():
        return f"a symbolic link (to {member.linkname!r})"
    if member.islnk():
        return f"a hard link (to {member.linkname!r})"
    if member.ischr() or member.isblk():
        return "a device file"
    if member.isfifo():
        return "a FIFO (named pipe)"
    if not (member.isreg() or member.isdir()):
        return f"an unsupported member type ({member.type!r})"
    return None


def _safe_parts(name: str) -> list[str] | str:
    """The member's path as components under the destination, or why it is refused."""
    if name.startswith(("/", "\\")):
        return "an absolute path"
    if "\x00" in name or "\\" in name:
        return "a path with a NUL or backslash"
    norm = posixpath.normpath(name)
    parts = [p for p in norm.split("/") if p not in ("", ".")]
    if ".." in parts:
        return "a path out of the artifacts folder (..)"
    return parts


def _open_dir(root_fd: int, parts: list[str]) -> int:
    """A descriptor of root/parts, creating folders as needed and never following a link."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                os.mkdir(part, dir_fd=fd)
                os.chmod(part, 0o755, dir_fd=fd, follow_symlinks=False)  # not the process umask's 0700
            except FileExistsError:
                pass
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _write_member(root_fd: int, parts: list[str], src: IO[bytes], size: int, check: Callable[[int], None]) -> None:
    """Stream one regular file to disk (mode 0644: no setuid/setgid/sticky bit, owner is us);
    `check(written)` runs after every chunk and may raise CapExceeded (the partial file is removed)."""
    parent = _open_dir(root_fd, parts[:-1])
    try:
        try:
            info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                raise OSError(f"{'/'.join(parts)} exists and is not a regular file")
        except FileNotFoundError:
            pass
        fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=parent)
        try:
            with os.fdopen(fd, "wb") as out:
                os.fchmod(out.fileno(), 0o644)
                written = 0
                while written < size:
                    chunk = src.read(min(CHUNK, size - written))
                    if not chunk:
                        raise OSError("the archive ends in the middle of a file")
                    out.write(chunk)
                    written += len(chunk)
                    check(written)
        except (CapExceeded, OSError):
            os.unlink(parts[-1], dir_fd=parent)
            raise
    finally:
        os.close(parent)


class _Counting:
    """A file wrapper that counts the compressed bytes read (for the expansion ratio)."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.count += len(data)
        return data


def _check_caps(caps: Caps, result: ArtifactResult, member: tarfile.TarInfo) -> None:
    """Before a file is opened: its declared size and the file count against the caps."""
    if result.files + 1 > caps.max_files:
        raise CapExceeded(f"more than {caps.max_files} files (cap {ENV_MAX_FILES})")
    if result.bytes + member.size > caps.max_bytes:
        raise CapExceeded(
            f"{member.name!r} ({member.size} bytes) would take the total past {caps.max_bytes} "
            f"bytes (cap {ENV_MAX_BYTES})"
        )


def _ratio_check(
    caps: Caps, result: ArtifactResult, member: tarfile.TarInfo, counting: _Counting
) -> Callable[[int], None]:
    """While a file streams: expanded bytes against compressed bytes read so far."""

    def check(written: int) -> None:
        total = result.bytes + written
        if total > RATIO_FLOOR and total > caps.max_ratio * max(counting.count, 1):
            raise CapExceeded(
                f"{member.name!r} expanded {counting.count} compressed bytes to more than {total} "
                f"(over {caps.max_ratio:g} times; cap {ENV_MAX_RATIO})"
            )

    return check


def extract_tar(fileobj: BinaryIO, dest: Path, caps: Caps | None = None, *, what: str = "artifact") -> ArtifactResult:
    """Extract a tar.gz stream into dest, member by member. A refused member is skipped with a
    warning (one bad member must not lose every other file); a cap stops the extraction with a
    warning naming the cap. Nothing is held in memory beyond one chunk."""
    caps = caps or Caps.from_env()
    dest.mkdir(parents=True, exist_ok=True)
    result = ArtifactResult(dest=dest)
    counting = _Counting(fileobj)
    root_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        # gzip.GzipFile reads every member of a multi-member gzip (RFC 1952), which tarfile's own
        # "r|gz" stream does not.
        gz = gzip.GzipFile(fileobj=counting, mode="rb")  # type: ignore[call-overload]
        with gz, tarfile.open(fileobj=gz, mode="r|") as tar:
            for member in tar:
                tar.members = []  # type: ignore[attr-defined]  # a stream: keep no list of every header
                parts = _safe_parts(member.name)
                why = parts if isinstance(parts, str) else _kind(member)
                if why is None and member.mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX):
                    why = "a setuid, setgid or sticky mode"
                if why is not None:
                    result.warnings.append(f"{what} {member.name!r} not extracted: {why}")
                    continue
                assert isinstance(parts, list)
                if member.isdir():
                    try:
                        os.close(_open_dir(root_fd, parts))
                    except OSError as exc:  # e.g. a link in its place: never followed
                        result.warnings.append(f"{what} {member.name!r} not extracted: {exc}")
                    continue
                if not parts:
                    continue
                src = tar.extractfile(member)
                assert src is not None
                try:
                    _check_caps(caps, result, member)
                    _write_member(
                        root_fd,
                        parts,
                        src,
                        member.size,
                        _ratio_check(caps, result, member, counting),
                    )
                except CapExceeded as exc:
                    result.warnings.append(
                        f"{what}s stopped after {result.files} file(s): {exc}; "
                        "the rest of the archive was not extracted"
                    )
                    break
                except OSError as exc:
                    result.warnings.append(f"{what} {member.name!r} not extracted: {exc}")
                    continue
                result.files += 1
                result.bytes += member.size
    except (tarfile.TarError, EOFError, OSError) as exc:
        result.warnings.append(f"{what}s: the archive is damaged ({exc}); extraction stopped")
    finally:
        os.close(root_fd)
    return result
