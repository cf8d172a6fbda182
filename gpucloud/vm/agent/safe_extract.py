"""Unpack a tar.gz from the channel (the code, a checkpoint) into a folder, safely: gpucloud's own
member walk, nothing from the archive trusted (docs/SECURITY.md).

Only regular files and folders (and, for the code the CLI packed, symbolic links whose target stays
inside); no absolute path or `..`; no setuid, setgid or sticky bit; no owner or mode taken from the
archive beyond the user's read/write/execute bits; caps on total bytes, member count and expansion ratio. The whole
listing is checked before anything is written, so a refused archive leaves the folder as it was.
Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tarfile
from pathlib import Path

MAX_BYTES = 8 * 1024**3
MAX_MEMBERS = 200_000
MAX_RATIO = 200.0  # unpacked bytes per archive byte, as the CLI's artifacts cap (gpucloud/channel/extract.py)
RATIO_FLOOR = 64 * 1024**2  # the ratio counts only past this: a small file of zeros packs very well


class Refused(Exception):
    """Why the archive is not unpacked (one line)."""


def _inside(name: str) -> bool:
    norm = posixpath.normpath(name)
    return not (name.startswith("/") or norm == ".." or norm.startswith("../") or "/../" in f"/{name}/")


def check_members(
    tar: tarfile.TarFile,
    *,
    links: bool,
    max_bytes: int,
    max_members: int,
    packed: int = 0,
    max_ratio: float = MAX_RATIO,
) -> list:
    members = []
    total = 0
    for m in tar:
        name = m.name
        if not _inside(name):
            raise Refused(f"a path out of the folder: {name}")
        if m.mode & 0o7000:
            raise Refused(f"a setuid, setgid or sticky mode: {name}")
        if m.issym():
            target = posixpath.normpath(posixpath.join(posixpath.dirname(name), m.linkname))
            if not links or m.linkname.startswith("/") or not _inside(target):
                raise Refused(f"a member of type l: {name}")
        elif not (m.isfile() or m.isdir()):
            kind = "h" if m.islnk() else "c" if m.ischr() else "b" if m.isblk() else "p" if m.isfifo() else "?"
            raise Refused(f"a member of type {kind}: {name}")
        total += m.size
        members.append(m)
        if len(members) > max_members:
            raise Refused(f"more than {max_members} members")
        if total > max_bytes:
            raise Refused(f"more than {max_bytes} bytes")
        if packed and total > RATIO_FLOOR and total > max_ratio * packed:
            raise Refused(f"it expands more than {max_ratio:g} times ({packed} bytes packed)")
    return members


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
    try:
        packed = os.path.getsize(archive)
        with tarfile.open(archive, "r:gz") as tar:
            members = check_members(
                tar, links=links, max_bytes=max_bytes, max_members=max_members, packed=packed, max_ratio=max_ratio
            )
            files = 0
            root = Path(dest)
            for m in members:
                target = root / posixpath.normpath(m.name)
                if m.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.is_symlink() or (target.exists() and not target.is_file()):
                    if target.is_dir() and not target.is_symlink():
                        shutil.rmtree(target)
                    else:
                        target.unlink()
                if m.issym():
                    os.symlink(m.linkname, target)
                    continue
                src = tar.extractfile(m)
                if src is None:
                    raise Refused(f"cannot read member {m.name}")
                with src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
                os.chmod(target, 0o755 if m.mode & 0o100 else 0o644)
                files += 1
            return files
    except (tarfile.TarError, EOFError, OSError) as exc:
        if isinstance(exc, Refused):
            raise
        raise Refused(f"the archive cannot be read ({exc.__class__.__name__})") from None
