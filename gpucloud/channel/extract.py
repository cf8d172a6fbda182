"""Extraction of a tar.gz that came from a machine we do not trust (a job's artifacts).

Neither tarfile's parser nor its extraction filters are used. The filters were bypassed by a
symlink chain longer than PATH_MAX on CPython before 3.11.13 / 3.12.11 / 3.13.4 (CVE-2025-4517),
and the parser reads a PAX header in time quadratic in its size before 3.11.10 / 3.12.6
(CVE-2024-6232); gpucloud runs on any Python >= 3.11. The headers are read by the node's own
bounded reader (gpucloud/vm/agent/safe_extract.py, `TarStream`: a PAX or long-name header over
64 KiB refuses the archive unread). The archive is read twice: once to count it against the caps
(members, files, folders, refused members, bytes, expansion ratio), writing nothing, so that a small
archive of a million members is refused in well under a second instead of filling the disk with
folders; then to write it. Only regular files and folders are written; no link, device or FIFO is
ever created, no mode bit beyond rwx and no owner is taken from the archive, every path is checked
against the destination before it is opened, and files are opened component by component without
following a link. Members stream to disk one chunk at a time (docs/SECURITY.md, "Archives and
extraction").
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from gpucloud.ui.untrusted import shown
from gpucloud.vm.agent.safe_extract import Damaged, Entry, Refused, TarStream, open_dir

GiB = 1024**3
CHUNK = 1024 * 1024
# Environment settings for the limits (docs/SECURITY.md): bytes (suffixes K, M, G, T), a count, a ratio.
ENV_MAX_BYTES = "GPUCLOUD_ARTIFACTS_MAX_BYTES"
ENV_MAX_FILES = "GPUCLOUD_ARTIFACTS_MAX_FILES"
ENV_MAX_RATIO = "GPUCLOUD_ARTIFACTS_MAX_RATIO"
ENV_MAX_FOLDERS = "GPUCLOUD_ARTIFACTS_MAX_FOLDERS"
ENV_MAX_REFUSED = "GPUCLOUD_ARTIFACTS_MAX_REFUSED"
ENV_MAX_MEMBERS = "GPUCLOUD_ARTIFACTS_MAX_MEMBERS"
DEFAULT_MAX_BYTES = 50 * GiB
DEFAULT_MAX_FILES = 100_000
DEFAULT_MAX_RATIO = 200.0
DEFAULT_MAX_FOLDERS = 20_000
DEFAULT_MAX_REFUSED = 10_000
# Every member, whatever it is (a skipped `./` too): by default the three limits above and 10,000 more,
# so that raising one of them raises this one too.
MEMBERS_SLACK = 10_000
DEFAULT_MAX_MEMBERS = DEFAULT_MAX_FILES + DEFAULT_MAX_FOLDERS + DEFAULT_MAX_REFUSED + MEMBERS_SLACK
SHOWN_REFUSED = 20  # refused members named one per line; the rest are counted in one line
# The ratio cap applies only once this much has been expanded: a small file of zeros compresses
# a thousand times over and is harmless; a few hundred MiB of it is not.
RATIO_FLOOR = 64 * 1024 * 1024
_SUFFIX = {"": 1, "K": 1024, "M": 1024**2, "G": GiB, "T": 1024**4}


class CapExceeded(Exception):
    """An extraction cap was reached; the rest of the archive is not extracted."""


@dataclass(frozen=True)
class ArchiveLimits:
    """Limits of one extraction (per node's archive)."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_files: int = DEFAULT_MAX_FILES
    max_ratio: float = DEFAULT_MAX_RATIO
    max_folders: int = DEFAULT_MAX_FOLDERS
    max_refused: int = DEFAULT_MAX_REFUSED
    max_members: int = DEFAULT_MAX_MEMBERS

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ArchiveLimits:
        """The limits from the environment; a value that does not parse is a UserError naming the variable."""
        from gpucloud.errors import UserError

        env = dict(os.environ if env is None else env)
        values: dict[str, float] = {}
        for name, key, kind in (
            (ENV_MAX_BYTES, "max_bytes", "size"),
            (ENV_MAX_FILES, "max_files", "count"),
            (ENV_MAX_RATIO, "max_ratio", "ratio"),
            (ENV_MAX_FOLDERS, "max_folders", "count"),
            (ENV_MAX_REFUSED, "max_refused", "count"),
            (ENV_MAX_MEMBERS, "max_members", "count"),
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
        kwargs: dict[str, Any] = {k: v if k == "max_ratio" else int(v) for k, v in values.items()}
        limits = cls(**kwargs)
        if "max_members" in values:
            return limits
        return replace(limits, max_members=limits.max_files + limits.max_folders + limits.max_refused + MEMBERS_SLACK)


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
    one warning per refused member (the first SHOWN_REFUSED; one line counts the rest), plus one
    when a cap refused the archive or damage stopped it. Every line is safe to print."""

    dest: Path
    files: int = 0
    bytes: int = 0
    warnings: list[str] = field(default_factory=list)
    refused_members: int = 0  # all of them, named or counted

    @property
    def refused(self) -> int:
        return count_refused(self.warnings)


# The line that counts refused members past the ones named, and a cap's line (both start with the
# plural, `artifacts`, where a member's line starts `artifact '<name>'`: a name cannot forge them).
_MORE = re.compile(r"(?:node \d+: )?[a-z]+s: (\d+) more member\(s\) not extracted")
_CAP_LINE = re.compile(r"(?:node \d+: )?[a-z]+s(?: not extracted:| not read back:| stopped after |: the archive)")
_CAP = re.compile(r"cap (GPUCLOUD_[A-Z_]+)\)")


def count_refused(lines: Sequence[str]) -> int:
    """How many members the refused lines stand for (a line `...: K more member(s) not extracted`
    stands for K, every other line for one)."""
    return sum(int(m.group(1)) if (m := _MORE.match(line)) else 1 for line in lines)


def about_archive(line: str) -> bool:
    """Whether a refused line is about a whole archive (a cap, a crafted header, damage, a linked
    folder) rather than about one member."""
    return bool(_CAP_LINE.match(line))


def cap_of(line: str) -> str | None:
    """The variable of the cap that a refused line says stopped an archive, or None."""
    named = _CAP.findall(line) if _CAP_LINE.match(line) else []
    return named[-1] if named else None  # the last: a member's name in the line comes before it


class ThroughLink(OSError):
    """A folder on the way to where artifacts are written is a link (or not a folder)."""

    def __init__(self, path: Path) -> None:
        super().__init__(errno.ELOOP, "a symbolic link or not a folder", str(path))
        self.path = path


def make_folders(base: Path, parts: Sequence[str]) -> None:
    """Create base/parts one folder at a time, each opened relative to its parent without following
    a link: ThroughLink names the first one that is a link (or a file), and nothing is created
    below it. `base` itself is the caller's choice and may be reached through links."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for depth, part in enumerate(parts, 1):
            try:
                nxt = open_dir(fd, [part])
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise ThroughLink(base.joinpath(*parts[:depth])) from None
                raise
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)


def _quoted(name: str) -> str:
    return f"'{name}'"  # the whole line passes through shown() when it is recorded


def _why_refused(member: Entry) -> str | None:
    """Why a member's type or mode is refused, or None for a regular file or folder."""
    if member.issym():
        return f"a symbolic link (to {_quoted(member.linkname)})"
    if member.type == b"1":
        return f"a hard link (to {_quoted(member.linkname)})"
    if member.type in (b"3", b"4"):
        return "a device file"
    if member.type == b"6":
        return "a FIFO (named pipe)"
    if not (member.isreg() or member.isdir()):
        return "a sparse file" if member.sparse else f"an unsupported member type ({member.type!r})"
    if member.mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX):
        return "a setuid, setgid or sticky mode"
    return None


def _safe_parts(name: str) -> list[str] | str:
    """The member's path as components under the destination, or why it is refused."""
    if name.startswith(("/", "\\")):
        return "an absolute path"
    if "\x00" in name or "\\" in name:
        return "a path with a NUL or backslash"
    parts = name.split("/")
    if "" in parts or "." in parts or ".." in parts:  # the plain case needs no normalising
        parts = [p for p in posixpath.normpath(name).split("/") if p not in ("", ".")]
    if ".." in parts:
        return "a path out of the artifacts folder (..)"
    return parts


def _classify(member: Entry) -> list[str] | str:
    """The member's components (a file or folder to write), or why it is refused."""
    parts = _safe_parts(member.name)
    if isinstance(parts, str):
        return parts
    return _why_refused(member) or parts


def _open_dir(root_fd: int, parts: list[str]) -> int:
    return open_dir(root_fd, parts, 0o755)  # 0755, not the process umask's 0700


def _write_member(root_fd: int, parts: list[str], tar: TarStream, check: Callable[[int], None]) -> None:
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
                while chunk := tar.data(CHUNK):
                    out.write(chunk)
                    written += len(chunk)
                    check(written)
        except (CapExceeded, Refused, OSError):
            os.unlink(parts[-1], dir_fd=parent)
            raise
    finally:
        os.close(parent)


@dataclass
class _Tally:
    """Counts of one pass over the archive, against the limits."""

    limits: ArchiveLimits
    members: int = 0
    files: int = 0
    folders: int = 0
    refused: int = 0
    bytes: int = 0

    def add(self, member: Entry, parts: list[str] | str) -> None:
        """Count one member; CapExceeded names the first cap it takes the archive past."""
        limits = self.limits
        self.members += 1
        if self.members > limits.max_members:
            raise CapExceeded(f"more than {limits.max_members} members (cap {ENV_MAX_MEMBERS})")
        if isinstance(parts, str):
            self.refused += 1
            if self.refused > limits.max_refused:
                raise CapExceeded(f"more than {limits.max_refused} refused members (cap {ENV_MAX_REFUSED})")
        elif member.isdir():
            self.folders += 1
            if self.folders > limits.max_folders:
                raise CapExceeded(f"more than {limits.max_folders} folders (cap {ENV_MAX_FOLDERS})")
        elif parts:
            if self.files + 1 > limits.max_files:
                raise CapExceeded(f"more than {limits.max_files} files (cap {ENV_MAX_FILES})")
            if self.bytes + member.size > limits.max_bytes:
                raise CapExceeded(
                    f"{_quoted(member.name)} ({member.size} bytes) would take the total past {limits.max_bytes} "
                    f"bytes (cap {ENV_MAX_BYTES})"
                )
            self.files += 1
            self.bytes += member.size

    def ratio(self, tar: TarStream, member: Entry) -> None:
        """The bytes decompressed so far against the compressed bytes read (the whole stream,
        headers and skipped data included, so that no member type escapes it)."""
        out, packed = tar.unpacked, max(tar.packed, 1)
        if out > RATIO_FLOOR and out > self.limits.max_ratio * packed:
            raise CapExceeded(
                f"{_quoted(member.name)} expanded {packed} compressed bytes to more than {out} "
                f"(over {self.limits.max_ratio:g} times; cap {ENV_MAX_RATIO})"
            )


def _scan(fileobj: BinaryIO, limits: ArchiveLimits) -> str | None:
    """The first pass, which writes nothing: why the archive is refused whole (a cap, a crafted
    header), or None. Damage is left for the second pass to report where it is."""
    tally = _Tally(limits)
    tar = TarStream(fileobj)
    try:
        for member in tar:
            tally.add(member, _classify(member))
            while tar.data(CHUNK):
                tally.ratio(tar, member)
    except CapExceeded as exc:
        return str(exc)
    except Damaged:
        return None
    except Refused as exc:
        return str(exc)
    return None


def extract_tar(
    fileobj: BinaryIO, dest: Path, limits: ArchiveLimits | None = None, *, what: str = "artifact"
) -> ArtifactResult:
    """Extract a tar.gz stream (a seekable file) into dest. The archive is first counted against
    the limits, writing nothing: over one, nothing is extracted and one warning names the cap. Then
    member by member: a refused member is skipped with a warning (one bad member must not lose
    every other file). Nothing is held in memory beyond one chunk."""
    limits = limits or ArchiveLimits.from_env()
    dest.mkdir(parents=True, exist_ok=True)
    result = ArtifactResult(dest=dest)
    start = fileobj.tell()
    over = _scan(fileobj, limits)
    if over is not None:
        fix = "raise the cap to take it, " if "(cap GPUCLOUD_" in over else ""
        result.warnings.append(
            shown(f"{what}s not extracted: {over}; nothing of this archive was kept ({fix}docs/SECURITY.md)")
        )
        return result
    fileobj.seek(start)
    try:
        root_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        result.warnings.append(shown(f"{what}s not extracted: {dest}: {exc.strerror}"))
        return result
    try:
        _extract(TarStream(fileobj), root_fd, limits, result, what)
    finally:
        os.close(root_fd)
    hidden = result.refused_members - SHOWN_REFUSED
    if hidden > 0:
        result.warnings.append(
            f"{what}s: {hidden} more member(s) not extracted (only the first {SHOWN_REFUSED} are named)"
        )
    return result


def _extract(tar: TarStream, root_fd: int, limits: ArchiveLimits, result: ArtifactResult, what: str) -> None:
    """The second pass: write what may be written, one line per refused member."""

    def refuse(name: str, why: object) -> None:
        result.refused_members += 1
        if result.refused_members <= SHOWN_REFUSED:
            result.warnings.append(shown(f"{what} {_quoted(name)} not extracted: {why}"))

    tally = _Tally(limits)
    try:
        for member in tar:
            parts = _classify(member)
            tally.add(member, parts)
            if isinstance(parts, str):
                refuse(member.name, parts)
            elif member.isdir():
                try:
                    os.close(_open_dir(root_fd, parts))
                except OSError as exc:  # e.g. a link in its place: never followed
                    refuse(member.name, exc)
            elif parts:
                try:
                    _write_member(root_fd, parts, tar, _ratio_check(tally, tar, member))
                except OSError as exc:
                    refuse(member.name, exc)
                    continue
                result.files += 1
                result.bytes += member.size
    except CapExceeded as exc:
        result.warnings.append(
            shown(f"{what}s stopped after {result.files} file(s): {exc}; the rest of the archive was not extracted")
        )
    except Refused as exc:  # Damaged among them: what came before it is kept
        result.warnings.append(shown(f"{what}s: the archive is damaged ({exc}); extraction stopped"))


def _ratio_check(tally: _Tally, tar: TarStream, member: Entry) -> Callable[[int], None]:
    return lambda _written: tally.ratio(tar, member)
