"""GPUCLOUD_HOME: where it is and that it is private (0700 folders, 0600 files). Light on imports
(no sqlite3): `plan` reads the catalog cache and baked-image index under it without the state store."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def home_dir() -> Path:
    """GPUCLOUD_HOME, else the platform's user data dir; created on first use."""
    env = os.environ.get("GPUCLOUD_HOME")
    if env:
        path = Path(env).expanduser()
    else:
        import platformdirs

        path = Path(platformdirs.user_data_dir("gpucloud"))
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    private_home(path)
    return path


PRIVATE_MARK = ".private-v1"  # this home's existing files were made private once
_private: set[Path] = set()


def private_home(home: Path) -> None:
    """GPUCLOUD_HOME holds run state, log copies and `env:` values: 0700 folders, 0600 files
    (docs/SECURITY.md, "Local files"). New files are private through the CLI's umask (entry.py);
    a home made by an older gpucloud (0755/0644) is tightened once, here, on first use."""
    if home in _private:
        return
    _private.add(home)
    _tighten(home)
    if (home / PRIVATE_MARK).exists():
        for name in ("state.db", "state.db-wal", "state.db-shm", "state.db-journal"):
            _tighten(home / name)
        return
    for root, dirs, files in os.walk(home):
        for name in (*dirs, *files):
            _tighten(Path(root) / name)
    fd = os.open(home / PRIVATE_MARK, os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)


def _tighten(path: Path) -> None:
    """Drop the group and other bits of a file or folder (never follows a link)."""
    try:
        mode = path.lstat().st_mode
        if mode & 0o077 and not stat.S_ISLNK(mode):
            os.chmod(path, stat.S_IMODE(mode) & 0o700)
    except OSError:  # gone, or not ours: the store's own checks report what matters
        pass


STATE_ENV = "GPUCLOUD_STATE"
USER_ENV = "GPUCLOUD_USER"


def state_url() -> str | None:
    """GPUCLOUD_STATE when it names a shared store (a postgresql:// URL), else None: the SQLite file
    under GPUCLOUD_HOME. Read here, without importing any driver, so `--help` and `plan` stay light."""
    value = os.environ.get(STATE_ENV, "").strip()
    return value or None


def current_user() -> str:
    """Who owns the runs this CLI launches: GPUCLOUD_USER (a CI job names its team's bot), else the
    login name. Runs in a shared store are listed and budgeted by it."""
    env = os.environ.get(USER_ENV, "").strip()
    if env:
        return env
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a uid without a passwd entry (some containers)
        return f"uid-{os.getuid()}"
