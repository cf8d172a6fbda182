"""Unpack a tar.gz from the channel (the code, a checkpoint) into a folder, safely: gpucloud's own
tar reader and member walk, nothing from the archive trusted (docs/SECURITY.md).

The reader (`TarStream`) is ours, not tarfile's, because tarfile's PAX header parser is quadratic
in the header's size on CPython before 3.8.20 / 3.9.20 / 3.10.15 / 3.11.10 / 3.12.6
(CVE-2024-6232): a 1 KB gzip of one large PAX header kept a process busy for many minutes. Ours
reads raw 512-byte headers, refuses a PAX or GNU long-name header over `MAX_EXT_HEADER` bytes
before reading it, parses PAX records in one linear pass, and decompresses a bounded amount at a
time. The CLI's artifacts extraction (gpucloud/channel/extract.py) uses the same reader.

Only regular files and folders (and, for the code the CLI packed, symbolic links whose target stays
inside); no absolute path or `..`; no setuid, setgid or sticky bit; no owner or mode taken from the
archive beyond the user's read/write/execute bits; caps on total bytes, member count and expansion
ratio. The whole listing is checked before anything is written, so a refused archive leaves the
folder as it was; files are then written through folders opened one by one without following a
link. Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import gzip
import os
import posixpath
import zlib
from pathlib import Path
from typing import BinaryIO, Dict, Iterator, List, Optional

MAX_BYTES = 8 * 1024**3
MAX_MEMBERS = 200_000
MAX_RATIO = 200.0  # unpacked bytes per archive byte, as the CLI's artifacts cap (gpucloud/channel/extract.py)
RATIO_FLOOR = 64 * 1024**2  # the ratio counts only past this: a small file of zeros packs very well
MAX_EXT_HEADER = 64 * 1024  # bytes of one PAX or GNU long-name header (a path is at most 4 KiB)
MAX_EXT_CHAIN = 8  # extension headers in a row before one member
BLOCK = 512
CHUNK = 1024 * 1024
_READ = 64 * 1024  # decompressed bytes asked of gzip at a time
_ZERO = bytes(BLOCK)
_REGULAR = (b"0", b"\x00", b"7")
_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")  # tarfile too reads no data for these, whatever the size says
_PAX_KEYS = (b"path", b"linkpath", b"size")
_KIND = {b"1": "h", b"2": "l", b"3": "c", b"4": "b", b"6": "p"}
_EXTENSIONS = (b"x", b"g", b"L", b"K")


class Refused(Exception):
    """Why the archive is not unpacked (one line)."""


class Damaged(Refused):
    """The archive is not a well-formed tar.gz (truncated, a bad checksum, a bad number)."""


class Entry:
    """One member as the raw headers describe it (PAX and GNU long names applied)."""

    __slots__ = ("name", "type", "size", "mode", "linkname", "sparse")

    def __init__(self, name: str, type_: bytes, size: int, mode: int, linkname: str, sparse: bool) -> None:
        self.name, self.type, self.size, self.mode = name, type_, size, mode
        self.linkname, self.sparse = linkname, sparse

    def isreg(self) -> bool:
        return self.type in _REGULAR and not self.sparse

    def isdir(self) -> bool:
        return self.type == b"5"

    def issym(self) -> bool:
        return self.type == b"2"

    def kind(self) -> str:
        """A one-letter type for a refusal line (tar's own letters; `?` for anything else)."""
        return _KIND.get(self.type, "?")


def _number(field: bytes) -> int:
    """A numeric header field: octal text, or GNU base-256 (first byte 0x80); negative is damage."""
    try:
        value = int(field.split(b"\x00", 1)[0] or b"0", 8)
    except ValueError:
        if field[:1] != b"\x80":
            raise Damaged("a header field that is not a number") from None
        value = int.from_bytes(field[1:], "big")
    if value < 0:
        raise Damaged("a negative number in a header")
    return value


def _text(field: bytes) -> str:
    return field.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")


def _pax_records(data: bytes) -> Dict[bytes, bytes]:
    """The PAX records gpucloud uses (`LEN KEY=VALUE\\n`), read in one pass; others are dropped."""
    out = {}  # type: Dict[bytes, bytes]
    pos, end = 0, len(data)
    while pos < end and data[pos] != 0:
        space = data.find(b" ", pos, pos + 12)
        digits = data[pos:space] if space > pos else b""
        if not digits.isdigit():
            raise Damaged("a PAX record without a length")
        length = int(digits)
        if length <= space - pos + 1 or pos + length > end or data[pos + length - 1] != 0x0A:
            raise Damaged("a PAX record with a wrong length")
        key, eq, value = data[space + 1 : pos + length - 1].partition(b"=")
        if not eq:
            raise Damaged("a PAX record without '='")
        if key in _PAX_KEYS or key.startswith(b"GNU.sparse."):
            out[key] = value
        pos += length
    return out


class TarStream:
    """The members of a tar.gz, read once from the front; data is read (or skipped) through
    `read()` before the next member. At most one decompressed chunk is held; `packed` and
    `unpacked` count compressed bytes read and bytes decompressed (for a ratio cap)."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.packed = 0
        self.unpacked = 0
        self._gz = gzip.GzipFile(fileobj=self, mode="rb")  # type: ignore[call-overload]  # reads every gzip member
        self._left = 0  # data bytes of the current member not read yet
        self._pad = 0
        self._globals = {}  # type: Dict[bytes, bytes]
        self._buf = b""  # decompressed, not consumed yet from _pos on (at most one read ahead)
        self._pos = 0

    def read(self, size: int = -1) -> bytes:  # the compressed side, for GzipFile
        data = self._raw.read(size)
        self.packed += len(data)
        return data

    def _take(self, n: int) -> bytes:
        """Exactly n decompressed bytes (or fewer at the very end of the stream)."""
        pos = self._pos
        if pos + n <= len(self._buf):  # most headers: a slice of what was decompressed already
            self._pos = pos + n
            return self._buf[pos : pos + n]
        data = self._buf[pos:]
        self._buf, self._pos = b"", 0
        try:
            while len(data) < n:
                more = self._gz.read(max(n - len(data), _READ))
                if not more:
                    break
                self.unpacked += len(more)
                data += more
        except (OSError, EOFError, zlib.error) as exc:
            raise Damaged("the archive cannot be read ({})".format(exc.__class__.__name__)) from None
        self._buf, self._pos = data, min(n, len(data))
        return data[:n] if len(data) > n else data

    def data(self, size: int) -> bytes:
        """Up to `size` bytes of the current member's data; b"" at its end."""
        size = min(size, self._left)
        if size <= 0:
            return b""
        chunk = self._take(size)
        if len(chunk) < size:
            raise Damaged("the archive ends in the middle of a file")
        self._left -= size
        return chunk

    def _skip(self) -> None:
        while self._left:
            self.data(CHUNK)
        if self._pad and len(self._take(self._pad)) < self._pad:
            raise Damaged("the archive ends in the middle of a file")
        self._pad = 0

    def _ext_data(self, size: int, what: str) -> bytes:
        if size > MAX_EXT_HEADER:
            raise Refused(
                "a {} of {} bytes (over the {}-byte cap on one header: a crafted archive)".format(
                    what, size, MAX_EXT_HEADER
                )
            )
        data = self._take(size + (-size) % BLOCK)
        if len(data) < size + (-size) % BLOCK:
            raise Damaged("the archive ends in a header")
        return data[:size]

    def __iter__(self) -> Iterator[Entry]:
        while True:
            self._skip()
            entry = self._next()
            if entry is None:
                return
            self._left = entry.size if (entry.isreg() or entry.type not in _NO_DATA) else 0
            self._pad = -self._left % BLOCK
            yield entry

    def _header(self) -> Optional[bytes]:
        block = self._take(BLOCK)
        if not block or block == _ZERO:
            return None
        if len(block) < BLOCK:
            raise Damaged("the archive ends in a header")
        field = block[148:156]
        # tar's checksum is the byte sum with its own field read as spaces; adler32's low half is
        # 1 + the byte sum modulo 65521, taken in C (a Python sum over 512 bytes is the slow part).
        if (_number(field) - 256 + sum(field) - (zlib.adler32(block) & 0xFFFF) + 1) % 65521:
            raise Damaged("a header with a bad checksum")
        return block

    def _next(self) -> Optional[Entry]:
        block = self._header()
        if block is None:
            return None
        kind = block[156:157]
        if kind not in _EXTENSIONS and not self._globals:  # the common case: one plain header
            return self._entry(block, kind, _number(block[124:136]), {}, {})
        ext = {}  # type: Dict[bytes, bytes]
        long = {}  # type: Dict[bytes, str]
        for _ in range(MAX_EXT_CHAIN):
            size = _number(block[124:136])
            if kind in (b"x", b"g"):
                records = _pax_records(self._ext_data(size, "PAX header"))
                (self._globals if kind == b"g" else ext).update(records)
            elif kind in (b"L", b"K"):
                long[kind] = _text(self._ext_data(size, "GNU long-name header"))
            else:
                pax = dict(self._globals)
                pax.update(ext)
                return self._entry(block, kind, size, pax, long)
            block = self._header()
            if block is None:
                return None
            kind = block[156:157]
        raise Damaged("more than {} extension headers in a row".format(MAX_EXT_CHAIN))

    def _entry(self, block: bytes, kind: bytes, size: int, pax: Dict[bytes, bytes], long: Dict[bytes, str]) -> Entry:
        name = _text(block[0:100])
        if block[345] and kind != b"S":  # a ustar prefix, as tarfile reads it
            name = _text(block[345:500]) + "/" + name
        entry = Entry(
            long.get(b"L", name),
            kind,
            size,
            _number(block[100:108]) & 0o7777,
            long.get(b"K", _text(block[157:257]) if block[157] else ""),
            kind == b"S",
        )
        if pax:
            _apply_pax(entry, pax)
        if kind == b"\x00" and entry.name.endswith("/"):
            entry.type = kind = b"5"
        if kind == b"5":
            entry.name = entry.name.rstrip("/")
        if kind == b"S" and block[482]:
            raise Refused("a GNU sparse file with extended headers: {}".format(entry.name))
        return entry


def _apply_pax(entry: Entry, pax: Dict[bytes, bytes]) -> None:
    """PAX records override the ustar fields (a long path, a size over 8 GiB)."""
    if b"path" in pax:
        entry.name = pax[b"path"].decode("utf-8", "surrogateescape")
    if b"linkpath" in pax:
        entry.linkname = pax[b"linkpath"].decode("utf-8", "surrogateescape")
    if b"size" in pax:
        if not pax[b"size"].isdigit() or len(pax[b"size"]) > 19:
            raise Damaged("a PAX size that is not a number")
        entry.size = int(pax[b"size"])
    entry.sparse = entry.sparse or any(k.startswith(b"GNU.sparse.") for k in pax)


def _inside(name: str) -> bool:
    norm = posixpath.normpath(name)
    return not (name.startswith("/") or norm == ".." or norm.startswith("../") or "/../" in f"/{name}/")


def _check(m: Entry, links: bool) -> None:
    """Refused: one member that may not be unpacked."""
    name = m.name
    if not _inside(name) or "\x00" in name:
        raise Refused(f"a path out of the folder: {name}")
    if m.mode & 0o7000:
        raise Refused(f"a setuid, setgid or sticky mode: {name}")
    if m.issym():
        target = posixpath.normpath(posixpath.join(posixpath.dirname(name), m.linkname))
        if not links or m.linkname.startswith("/") or not _inside(target):
            raise Refused(f"a member of type l: {name}")
    elif not (m.isreg() or m.isdir()):
        raise Refused(f"a member of type {m.kind()}: {name}")


def check_members(
    tar: TarStream,
    *,
    links: bool,
    max_bytes: int,
    max_members: int,
    max_ratio: float = MAX_RATIO,
) -> int:
    """Read the whole archive once and refuse it on the first unsafe member or cap; the member count."""
    count = total = 0
    for m in tar:
        _check(m, links)
        total += m.size
        count += 1
        if count > max_members:
            raise Refused(f"more than {max_members} members")
        if total > max_bytes:
            raise Refused(f"more than {max_bytes} bytes")
        while True:  # the data too, so that the ratio is measured on what unpacking would write
            if tar.unpacked > RATIO_FLOOR and tar.unpacked > max_ratio * max(tar.packed, 1):
                raise Refused(f"it expands more than {max_ratio:g} times ({tar.packed} bytes packed so far)")
            if not tar.data(CHUNK):
                break
    return count


def open_dir(root_fd: int, parts: List[str], mode: Optional[int] = None) -> int:
    """A descriptor of root/parts, creating folders as needed and never following a link (an
    OSError, ELOOP or ENOTDIR, where one is a link or not a folder). `mode`: set on each folder
    it creates, whatever the umask; None: 0o755 under the umask."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
                if mode is not None:
                    os.chmod(part, mode, dir_fd=fd, follow_symlinks=False)
            except FileExistsError:
                pass
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _clear(parent: int, name: str) -> None:
    """Make room for a member: what the archive replaces (a file, a link, a folder tree) goes."""
    try:
        os.unlink(name, dir_fd=parent)
    except FileNotFoundError:
        return
    except (IsADirectoryError, PermissionError):
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
        try:
            for child in os.listdir(fd):
                _clear(fd, child)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=parent)


def _write(root_fd: int, m: Entry, tar: TarStream) -> None:
    parts = [p for p in posixpath.normpath(m.name).split("/") if p not in ("", ".")]
    if m.isdir() or not parts:
        os.close(open_dir(root_fd, parts))
        return
    parent = open_dir(root_fd, parts[:-1])
    try:
        _clear(parent, parts[-1])
        if m.issym():
            os.symlink(m.linkname, parts[-1], dir_fd=parent)
            return
        mode = 0o755 if m.mode & 0o100 else 0o644
        fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=parent)
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), mode)
            chunk = tar.data(CHUNK)
            while chunk:
                out.write(chunk)
                chunk = tar.data(CHUNK)
    finally:
        os.close(parent)


def safe_untar(
    archive: Path,
    dest: Path,
    *,
    links: bool = False,
    max_bytes: int = MAX_BYTES,
    max_members: int = MAX_MEMBERS,
    max_ratio: float = MAX_RATIO,
) -> int:
    """Unpack `archive` into `dest`; the number of regular files. Raises Refused."""
    with open(archive, "rb") as raw:
        check_members(TarStream(raw), links=links, max_bytes=max_bytes, max_members=max_members, max_ratio=max_ratio)
    Path(dest).mkdir(parents=True, exist_ok=True)
    root_fd = os.open(str(dest), os.O_RDONLY | os.O_DIRECTORY)
    files = 0
    try:
        with open(archive, "rb") as raw:
            tar = TarStream(raw)
            for m in tar:
                _check(m, links)  # the same file as the first pass: checked again, cheaply
                _write(root_fd, m, tar)
                files += m.isreg()
    except OSError as exc:
        raise Refused(f"the archive cannot be unpacked ({exc.__class__.__name__}: {exc.strerror})") from None
    finally:
        os.close(root_fd)
    return files
