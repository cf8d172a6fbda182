"""The state store on PostgreSQL, for a team: GPUCLOUD_STATE=postgresql://user@host/db.

Store imports this module, and this module imports psycopg (the `postgres` extra), only when that
URL is set: the default SQLite store, `--help` and `plan` never load a driver.

The store's SQL is written once, in SQLite's dialect with `?` placeholders; `PgSession` turns the
placeholders into psycopg's and hands back rows that read like sqlite3.Row (by column name, and
dict()). Reads run in autocommit; every write is one transaction (`tx`), where PostgreSQL's row
locks take the place of SQLite's file lock: two writers of different runs never wait for each other,
and two writers of one row queue on it. Schema upgrades and the few read-then-write steps (watcher
leases, budget checks) serialise on advisory locks and SELECT ... FOR UPDATE.
"""

from __future__ import annotations

import functools
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpucloud.errors import GpucloudError
from gpucloud.state.guard import REQUIRED_COLUMNS, StoreError

CONNECT_TIMEOUT_S = 10
MIGRATION_LOCK = zlib.crc32(b"gpucloud schema")  # the advisory lock every schema upgrade takes


class StateSetupError(GpucloudError):
    """GPUCLOUD_STATE cannot be used as set: not a postgresql:// URL, or the driver is not installed.
    Exit 78 (EX_CONFIG): a setting to fix, not a damaged store."""

    exit_code = 78
    kind = "configuration"


def _driver() -> Any:
    try:
        import psycopg
    except ImportError:
        raise StateSetupError(
            "GPUCLOUD_STATE names a PostgreSQL server, but the PostgreSQL driver (psycopg 3) is not installed.",
            hint="Install it with `pip install 'gpucloud[postgres]'`, or unset GPUCLOUD_STATE to use the "
            "SQLite store under GPUCLOUD_HOME.",
        ) from None
    return psycopg


def describe_url(url: str) -> str:
    """The URL as it may be shown: without its password (the driver parses it; a URL it cannot parse
    is shown only by its scheme)."""
    scheme = url.split("://", 1)[0] if "://" in url else "?"
    try:
        from psycopg.conninfo import conninfo_to_dict

        parts = conninfo_to_dict(url)
    except Exception:
        return f"{scheme}://..."
    user = f"{parts['user']}@" if parts.get("user") else ""
    host = str(parts.get("host") or "localhost")
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"{scheme}://{user}{host}{port}/{parts.get('dbname') or ''}"


def check_url(url: str) -> None:
    """A GPUCLOUD_STATE this gpucloud cannot use, as one paragraph before anything is opened."""
    if not url.startswith(("postgresql://", "postgres://")):
        raise StateSetupError(
            f"GPUCLOUD_STATE={url.split('://', 1)[0]}://... is not a state store gpucloud knows.",
            hint="Set it to a PostgreSQL URL (postgresql://USER@HOST:PORT/DATABASE; the password in "
            "~/.pgpass or PGPASSWORD), or unset it to use the SQLite store under GPUCLOUD_HOME.",
        )
    _driver()
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(url)
    except Exception:  # its message repeats the URL, and with it any password
        raise StateSetupError(
            "GPUCLOUD_STATE is not a PostgreSQL URL the driver can read (a bracket, port or option is malformed).",
            hint="Write it as postgresql://USER@HOST:PORT/DATABASE (percent-encode special characters), "
            "or unset it to use the SQLite store under GPUCLOUD_HOME.",
        ) from None


def unusable(where: str, why: str, handles: Path) -> StoreError:
    """The shared store cannot be reached or used: exit 74, as for a damaged SQLite store."""
    return StoreError(
        f"The shared state store {where} cannot be used: {why}.",
        path=handles,
        hint="Check that the server runs and accepts this user (`psql URL -c 'select 1'` tells), and "
        "GPUCLOUD_STATE. Machines still running are not lost: `gpucloud down RUN` tears a run down from "
        f"its handle files in {handles}, and `gpucloud gc` sweeps by the clouds' tags.",
    )


@functools.lru_cache(maxsize=512)
def to_psycopg(sql: str) -> str:
    """SQLite's `?` placeholders as psycopg's `%s` (a literal % doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


class PgSession:
    """What the store's SQL runs through: `execute`/`executemany` with `?` placeholders."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> Any:
        return self.conn.execute(to_psycopg(sql), tuple(args))

    def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(to_psycopg(sql), rows)


class PgBackend:
    """One connection per Store (guarded by a lock, as the SQLite one), reconnected when the server
    dropped it; a query that fails for the connection is the store's StoreError (exit 74)."""

    def __init__(self, url: str, handles: Path) -> None:
        check_url(url)
        self.url, self.where, self.handles = url, describe_url(url), handles
        self.lock = threading.RLock()
        self._conn: Any = None
        with self.lock:
            self._connect()
            self._migrate()
            if why := self._schema_problem():
                raise unusable(self.where, why, handles)

    def _connect(self) -> Any:
        psycopg = _driver()
        from psycopg.rows import dict_row

        try:
            self._conn = psycopg.connect(
                self.url,
                autocommit=True,
                row_factory=dict_row,
                connect_timeout=CONNECT_TIMEOUT_S,
                application_name="gpucloud",
            )
        except psycopg.Error as exc:
            raise unusable(self.where, _first_line(exc), self.handles) from None
        return self._conn

    def _live(self) -> Any:
        if self._conn is None or self._conn.closed or self._conn.broken:
            return self._connect()
        return self._conn

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """A lost server is the store's error; a constraint violation stays what it is."""
        import psycopg

        try:
            yield
        except psycopg.IntegrityError:
            raise
        except psycopg.OperationalError as exc:
            raise unusable(self.where, _first_line(exc), self.handles) from None

    @contextmanager
    def tx(self) -> Iterator[PgSession]:
        """One write transaction; a retryable serialisation failure or deadlock is retried by the caller."""
        with self.lock, self._errors():
            conn = self._live()
            with conn.transaction():
                yield PgSession(conn)

    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        with self.lock, self._errors():
            return list(PgSession(self._live()).execute(sql, args).fetchall())

    def close(self) -> None:
        with self.lock:
            if self._conn is not None:
                self._conn.close()

    # -- schema ---------------------------------------------------------------------------------------

    def _migrate(self) -> None:
        """Apply what is missing in one transaction, under an advisory lock: two CLIs opening a new
        database upgrade it once."""
        from gpucloud.state.schema import postgres_migrations

        steps = postgres_migrations()
        with self.tx() as c:
            c.execute("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK,))
            c.execute("CREATE TABLE IF NOT EXISTS gpucloud_schema (version INTEGER NOT NULL)")
            row = c.execute("SELECT version FROM gpucloud_schema").fetchone()
            if row is None:
                c.execute("INSERT INTO gpucloud_schema (version) VALUES (0)")
            version = int(row["version"]) if row else 0
            for i in range(version, len(steps)):
                for stmt in filter(None, (s.strip() for s in steps[i].split(";"))):
                    c.execute(stmt)
                c.execute("UPDATE gpucloud_schema SET version = ?", (i + 1,))

    def version(self) -> int:
        return int(self.query("SELECT version FROM gpucloud_schema")[0]["version"])

    def _schema_problem(self) -> str | None:
        from gpucloud.state.schema import SCHEMA_VERSION

        if (version := self.version()) > SCHEMA_VERSION:
            return (
                f"it was written by a newer gpucloud (schema {version}; this one knows up to {SCHEMA_VERSION}). "
                "Upgrade gpucloud"
            )
        rows = self.query(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema()"
        )
        have: dict[str, set[str]] = {}
        for r in rows:
            have.setdefault(r["table_name"], set()).add(r["column_name"])
        for table, needed in REQUIRED_COLUMNS.items():
            if missing := needed - have.get(table, set()):
                return f"its '{table}' table lacks {', '.join(sorted(missing))} (not a gpucloud state store)"
        return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0].rstrip(".") if text else type(exc).__name__
