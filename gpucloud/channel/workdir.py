"""The job's workdir as it travels: the files that go into the code tarball (.gitignore honoured,
through git where the folder is in a work tree) and the tarball itself, stopped at the size cap.
Kept apart from the channel (run_objects.py) so that `plan` and `validate` can count the upload without
importing the channel's transfer and trust code."""

from __future__ import annotations

import fnmatch
import io
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

from gpucloud.errors import UserError

MiB = 1024 * 1024
DEFAULT_CODE_CAP = 100 * MiB
ALWAYS_SKIP = frozenset({".git", "__pycache__", ".venv", "gpucloud-runs"})


def _git_files(root: Path) -> list[str] | None:
    """Files git would consider part of the work tree under root (tracked + untracked, not ignored);
    None when root is not inside a git work tree or git is missing."""
    try:
        inside = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"], capture_output=True, text=True, timeout=30
        )
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            timeout=120,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return sorted({p for p in out.stdout.decode("utf-8", "surrogateescape").split("\0") if p})


class _IgnoreRule:
    def __init__(self, base: str, line: str) -> None:
        self.negate = line.startswith("!")
        line = line[1:] if self.negate else line
        self.dir_only = line.endswith("/")
        line = line.rstrip("/")
        self.anchored = "/" in line  # a slash anywhere but the end anchors to the .gitignore's folder
        self.pattern = line.lstrip("/")
        self.base = base  # folder of the .gitignore, relative to the workdir ("" = top)

    def matches(self, rel: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.base:
            if not rel.startswith(self.base + "/"):
                return False
            rel = rel[len(self.base) + 1 :]
        if self.anchored:
            pat = self.pattern.replace("**/", "*")  # fnmatch's * crosses "/": close enough for ** forms
            return fnmatch.fnmatchcase(rel, pat)
        return fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], self.pattern)


def _read_ignore(dirpath: Path, base: str) -> list[_IgnoreRule]:
    try:
        text = (dirpath / ".gitignore").read_text(errors="replace")
    except OSError:
        return []
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if line and not line.startswith("#"):
            rules.append(_IgnoreRule(base, line))
    return rules


def _walk_files(root: Path) -> Iterator[str]:
    """Files under root minus what .gitignore files (root's and nested ones) exclude: the common
    subset of gitignore (globs, !negation, anchors, dir/ patterns) for folders outside git."""

    def ignored(rules: list[_IgnoreRule], rel: str, is_dir: bool) -> bool:
        verdict = False
        for rule in rules:
            if rule.matches(rel, is_dir):
                verdict = not rule.negate
        return verdict

    def walk(dirpath: Path, rel_dir: str, rules: list[_IgnoreRule]) -> Iterator[str]:
        rules = rules + _read_ignore(dirpath, rel_dir)
        try:
            entries = sorted(os.scandir(dirpath), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            if entry.name in ALWAYS_SKIP or ignored(rules, rel, is_dir):
                continue
            if is_dir:
                yield from walk(Path(entry.path), rel, rules)
            else:
                yield rel

    yield from walk(root, "", [])


def _skipped_prefixes(root: Path, skip: Sequence[Path]) -> tuple[str, ...]:
    """The folders of `skip` that lie inside `root` (resolved), as relative path prefixes."""
    try:
        base = root.resolve()
    except OSError:
        return ()
    out = []
    for place in skip:
        if base in place.parents:
            out.append(place.relative_to(base).as_posix() + "/")
    return tuple(out)


def workdir_files(path: Path, skip: Sequence[Path] = ()) -> list[str]:
    """Relative paths that go into the code tarball, sorted; nothing under a folder of `skip`
    (resolved paths: the places that hold credentials, which a workdir such as `..` may contain)."""
    root = Path(path)
    files = _git_files(root)
    if files is None:
        files = list(_walk_files(root))
    skipped = _skipped_prefixes(root, skip)
    keep = []
    for rel in files:
        if any(part in ALWAYS_SKIP for part in rel.split("/")) or (rel + "/").startswith(skipped):
            continue
        full = root / rel
        if full.is_symlink() or full.is_file():  # git lists deleted-but-tracked files too
            keep.append(rel)
    return keep


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def pack_workdir(
    path: Path, cap_bytes: int = DEFAULT_CODE_CAP, dest: Path | None = None, skip: Sequence[Path] = ()
) -> Path:
    """Pack the job's workdir into a tar.gz (what every node fetches), honouring .gitignore.

    Stops as soon as the compressed size passes `cap_bytes` (within a file too) and raises a UserError that names the
    folder, the size, the cap and how to fix it, rather than uploading a dataset by accident.
    `dest` defaults to a fresh temporary file (the caller removes it after upload); nothing under
    a folder of `skip` is packed (workdir_files).
    """
    root = Path(path).resolve()
    if not root.is_dir():
        raise UserError(
            f"workdir {root} is not a folder.", hint="Set `workdir` in the job file to the folder with your code."
        )
    if dest is None:
        dest = Path(tempfile.mkdtemp(prefix="gpucloud-code-")) / "code.tar.gz"

    def too_big(size: str) -> UserError:
        return UserError(
            f"workdir {root} packs to {size}, above the cap of {human_bytes(cap_bytes)}.",
            hint="Add large files (datasets, checkpoints, outputs) to .gitignore and download them in "
            "`setup`, or point `workdir` at a smaller folder.",
        )

    files = workdir_files(root, skip)
    try:
        with open(dest, "wb") as raw:
            capped = _CappedWriter(raw, cap_bytes)
            with tarfile.open(fileobj=capped, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
                for rel in files:
                    tar.add(str(root / rel), arcname=rel, recursive=False)
    except _PastCap as past:
        Path(dest).unlink(missing_ok=True)
        raise too_big(f"more than {human_bytes(past.size)}") from None
    return Path(dest)


class _PastCap(Exception):
    """The compressed bytes written so far passed the cap (raised from the tarball's own write)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class _CappedWriter(io.RawIOBase):
    """The tarball's file, that stops the packing once the compressed bytes pass the cap, in the middle
    of a file too: a dataset of many GiB left in the workdir is refused after about the cap's worth of
    compression, not after compressing all of it."""

    def __init__(self, raw: BinaryIO, cap: int) -> None:
        super().__init__()
        self.raw, self.cap = raw, cap

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer, /) -> int:
        written = self.raw.write(data)
        if self.raw.tell() > self.cap:
            raise _PastCap(self.raw.tell())
        return written

    def tell(self) -> int:
        return self.raw.tell()
