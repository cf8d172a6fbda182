"""What keeps a damaged state store from stranding paid machines (docs/INTERNALS.md, "State store
damage"): the one error a store that cannot be used gives (its path, why, and the `mv` that moves
it aside), the check of its schema, and the run-handle files kept beside it.

Each attempt's RunHandle is also written to `<store folder>/runs/<run id>/handle-<attempt>.json`
before it goes into the database, so `gpucloud down RUN` can tear a run down when the database
cannot be read; `gpucloud gc` then sweeps by the clouds' expiry tags.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import sqlite3
import time
from pathlib import Path

from gpucloud.errors import GpucloudError
from gpucloud.prose import VERBATIM_INDENT, to_stderr

# Tables and the columns this gpucloud reads; a store without them was not written by gpucloud
# (or by a version that no migration reaches).
REQUIRED_COLUMNS: dict[str, frozenset[str]] = {
    "runs": frozenset({"id", "name", "status", "created_at", "cloud", "region", "pid", "detached", "owner"}),
    "attempts": frozenset({"run_id", "idx", "cloud", "region", "handle_json", "launched"}),
    "resources": frozenset({"id", "run_id", "cloud", "kind", "status", "cloud_id"}),
    "events": frozenset({"run_id", "ts", "kind", "message"}),
    "phases": frozenset({"run_id", "name", "seconds"}),
}


class StoreError(GpucloudError):
    """The state store cannot be read or written (damaged, foreign, read-only). Exit 74 (EX_IOERR)."""

    exit_code = 74

    def __init__(self, message: str, *, path: Path, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.path = path


def move_aside_command(path: Path) -> str:
    """The shell command that moves the store (and its WAL side files, when present) aside."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moves = [
        f"mv {shlex.quote(str(p))} {shlex.quote(f'{p}.damaged-{stamp}')}"
        for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm"))
        if p == path or p.exists()
    ]
    return " && ".join(moves)


def store_error(path: Path, why: str) -> StoreError:
    """One paragraph: which file, what is wrong with it, the command that fixes it, and that
    running machines are still found without it."""
    command = f"\n{VERBATIM_INDENT}{move_aside_command(path)}"  # one line, never wrapped: it is copied
    fix = f"Move it aside (gpucloud then starts a new, empty one):{command}"
    if "read-only" in why:
        fix = f"Make it writable again (chmod u+w {shlex.quote(str(path))}), or move it aside:{command}"
    return StoreError(
        f"The state store {path} cannot be used: {why}.",
        path=path,
        hint=f"{fix}\nMachines still running are not lost: `gpucloud down RUN` tears a run down from its "
        f"handle files in {handles_root(path)}, and `gpucloud gc` sweeps by the clouds' tags.",
    )


def describe_sqlite_error(exc: BaseException) -> str:
    """sqlite's message in words a user can act on."""
    text = str(exc)
    if "not a database" in text:
        return "it is not an SQLite database (garbage or another file)"
    if "malformed" in text or "disk image" in text:
        return "the database file is damaged (truncated or corrupted)"
    if "readonly" in text or "read-only" in text:
        return "it is read-only"
    return f"SQLite says: {text}"


SQLITE_IOERR, SQLITE_FULL = 10, 13  # primary result codes (an extended code keeps them in its low byte)
NEARLY_FULL = 1 << 20  # bytes free under which SQLite's "disk I/O error" is read as a full disk
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def _free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on the file system that holds `path` (or its
    nearest existing folder), None when it cannot be asked."""
    for folder in (path, *path.parents):
        try:
            st = os.statvfs(folder)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize
    return None


def _mount_of(path: Path) -> str:
    """`<mount point>` (`<device>`) holding `path`, from /proc/self/mounts where there is one."""
    folder = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    mount = folder.resolve()
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as fh:
            devices = {line.split()[1]: line.split()[0] for line in fh if len(line.split()) > 1}
    except OSError:
        devices = {}
    device = devices.get(str(mount))
    return f"{mount} ({device})" if device else str(mount)


def no_space(exc: BaseException, path: Path | None = None) -> StoreError | None:
    """A full disk (SQLite's SQLITE_FULL, its I/O error on a disk with almost nothing free, or an
    OSError ENOSPC/EDQUOT) as its own error, or None: it is not damage, and moving the store aside
    (the fix for damage) would not help. Exit 74 (EX_IOERR) all the same."""
    where = Path(path) if path is not None else None
    if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
        where = Path(os.fsdecode(exc.filename)) if exc.filename else where
    elif isinstance(exc, sqlite3.Error) and where is not None:
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        full = code == SQLITE_FULL or "disk is full" in str(exc)
        if not full and (code == SQLITE_IOERR or "disk I/O error" in str(exc)):
            free = _free_bytes(where)
            full = free is not None and free < NEARLY_FULL
        if not full:
            return None
    else:
        return None
    if where is None:
        return None
    free = _free_bytes(where)
    mount = _mount_of(where)
    return StoreError(
        f"No space left on {mount}, which holds {where}"
        + (f" ({free // 1024} KiB free)" if free is not None else "")
        + ": gpucloud could not write there.",
        path=where,
        hint=f"Free space on {mount.split(' ')[0]} (`df -h {shlex.quote(str(where.parent))}` shows it), or set "
        "GPUCLOUD_HOME to a folder on another disk, then run the command again. Nothing is damaged: do "
        "not move the state store aside. Machines still running are not lost: they end at their "
        "max_duration, `gpucloud down RUN` ends one sooner once there is room, and `gpucloud gc` "
        "sweeps by the clouds' tags.",
    )


def sqlite_store_error(path: Path, exc: BaseException) -> StoreError:
    """The StoreError for an SQLite error on the store: a full disk, or the store's damage."""
    return no_space(exc, path) or store_error(path, describe_sqlite_error(exc))


LOCK_WAIT_ENV = "GPUCLOUD_STATE_LOCK_WAIT"
DEFAULT_LOCK_WAIT_S = 600.0


def lock_wait_s() -> float:
    """How long a write waits for another process's lock on the store (GPUCLOUD_STATE_LOCK_WAIT, seconds)."""
    try:
        return max(0.0, float(os.environ.get(LOCK_WAIT_ENV, "") or DEFAULT_LOCK_WAIT_S))
    except ValueError:
        return DEFAULT_LOCK_WAIT_S


def begin_immediate(conn: sqlite3.Connection, path: Path) -> None:
    """BEGIN IMMEDIATE, waiting with backoff (each try already waits SQLite's busy timeout) while
    another process holds the write lock: a `status` in another terminal or a stuck tool must never
    turn a finished run into an internal error or skip its teardown. Past lock_wait_s() the store
    is unusable for now (StoreError, exit 74): the run then tears down from its handle files."""
    limit, start, delay, told = lock_wait_s(), time.monotonic(), 0.05, False
    while True:
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as exc:
            if not is_busy(exc):
                raise
            waited = time.monotonic() - start
            if waited >= limit:
                raise StoreError(
                    f"The state store {path} stayed locked by another process for {waited:.0f}s.",
                    path=path,
                    hint=f"`fuser -v {shlex.quote(str(path))}` names the process holding it: end it, or set "
                    f"{LOCK_WAIT_ENV} to wait longer (seconds; now {limit:.0f}). Machines still running are "
                    f"not lost: `gpucloud down RUN` works from the handle files in {handles_root(path)}.",
                ) from None
            if not told:
                to_stderr(
                    f"note: the state store {path} is locked by another process; waiting for it "
                    f"(up to {limit:.0f}s, {LOCK_WAIT_ENV})"
                )
                told = True
            time.sleep(min(delay, max(0.01, limit - waited)))
            delay = min(delay * 2, 2.0)


def is_busy(exc: BaseException) -> bool:
    """Another gpucloud holds the lock: not damage, the caller waits or retries."""
    text = str(exc)
    return "locked" in text or "busy" in text


def check_schema(conn: sqlite3.Connection, known_version: int) -> str | None:
    """Why the opened database is not a gpucloud store this version can use, or None."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > known_version:
        return (
            f"it was written by a newer gpucloud (schema {version}; this one knows up to "
            f"{known_version}). Upgrade gpucloud, or move it aside"
        )
    for table, needed in REQUIRED_COLUMNS.items():
        have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})").fetchall()}
        if not have:
            return f"it has no '{table}' table (not a gpucloud state store)"
        if missing := needed - have:
            return f"its '{table}' table lacks {', '.join(sorted(missing))} (not a gpucloud state store)"
    return None


def writable_problem(path: Path) -> str | None:
    """A store gpucloud cannot write is as unusable as a damaged one: say so before a run starts."""
    # Mode bits too: root may write a 0444 file, but whoever made it read-only meant it.
    if path.exists() and (not os.access(path, os.W_OK) or not path.stat().st_mode & 0o222):
        return "it is read-only"
    if not os.access(path.parent, os.W_OK):
        return f"its folder {path.parent} is read-only"
    return None


# ---- run-handle files ------------------------------------------------------------------------------


def handles_root(store_path: Path) -> Path:
    return store_path.parent / "runs"


def write_handle(store_path: Path, run_id: str, idx: int, handle_json: str) -> None:
    """Write one attempt's handle beside the store (atomically: a half-written file is never read)."""
    folder = handles_root(store_path) / run_id
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".handle-{idx}.{os.getpid()}"
    tmp.write_text(handle_json, encoding="utf-8")
    os.replace(tmp, folder / f"handle-{idx}.json")


def read_handles(store_path: Path, ref: str) -> tuple[str, list[dict[str, object]]]:
    """The run id that `ref` (an id or a unique prefix) names and its handles, newest attempt last.
    Raises LookupError with a readable reason when there is none or `ref` is ambiguous."""
    root = handles_root(store_path)
    names = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    matches = [n for n in names if n == ref] or [n for n in names if n.startswith(ref)]
    if not matches:
        raise LookupError(f"no run handle files for {ref!r} in {root}")
    if len(matches) > 1:
        raise LookupError(f"{ref!r} matches several runs in {root}: {', '.join(matches)}")
    files = sorted(
        (root / matches[0]).glob("handle-*.json"),
        key=lambda p: int(p.stem.split("-", 1)[1]) if p.stem.split("-", 1)[1].isdigit() else -1,
    )
    docs = []
    for path in files:
        try:
            docs.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    if not docs:
        raise LookupError(f"the run handle files of {matches[0]} in {root / matches[0]} cannot be read")
    return matches[0], docs
