"""A real PostgreSQL server for the shared-state tests: Debian's `postgresql` package (`.ci/run`
installs it), one cluster per test session in a temporary folder, on 127.0.0.1 and a free port.

PostgreSQL refuses to run as root, and CI runs as root: the cluster then belongs to the `postgres`
user (the package creates it; else `nobody`) and its commands run through `runuser`. Each test gets
a database of its own (`fresh_database`), so tests never see each other's runs."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from tests.support.sshd import free_port


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def have_postgres() -> bool:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return False
    return _bindir() is not None


def missing() -> str:
    return "needs PostgreSQL (apt-get install postgresql) and psycopg (pip install 'gpucloud[postgres]')"


def _service_user() -> str | None:
    """Who runs the server when we are root (None: ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("running as root with neither a postgres nor a nobody user to run PostgreSQL as")


class PostgresServer:
    """initdb (trust auth, for the one local test user) + pg_ctl start; `url(db)` for a database."""

    def __init__(self) -> None:
        bindir = _bindir()
        assert bindir is not None, missing()
        self.bindir = bindir
        self.user = _service_user()
        self.root = Path(tempfile.mkdtemp(prefix="gpucloud-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.role = self.user or pwd.getpwuid(os.getuid()).pw_name

    def _cmd(self, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        full = ["runuser", "-u", self.user, "--", *argv] if self.user else argv
        return subprocess.run(full, capture_output=True, text=True, timeout=timeout, check=True, cwd=self.root)

    def start(self) -> PostgresServer:
        os.chmod(self.root, 0o755)
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._cmd([str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", self.role, "-E", "UTF8"])
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off -c max_connections=200"
        self._cmd(
            [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"), "-w", "-o", options]
            + ["start"],
            timeout=120,
        )
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.role}@127.0.0.1:{self.port}/{database}"

    def fresh_database(self) -> str:
        """A new, empty database; its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def log(self) -> str:
        try:
            return (self.root / "log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        try:
            self._cmd([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"], timeout=60)
        except (subprocess.SubprocessError, OSError):
            pass
        shutil.rmtree(self.root, ignore_errors=True)
