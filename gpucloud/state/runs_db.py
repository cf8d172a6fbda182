"""The state store: one SQLite file under GPUCLOUD_HOME with runs, resources, events and phase timings.

Why SQLite: it needs no server, survives a crash of the CLI, and lets several CLI processes (a
`run` following a job, a `status` or `down` in another terminal) share one store safely. WAL mode,
a busy timeout and short transactions keep concurrent writers from failing.

The schema grows by numbered migrations (MIGRATIONS; `PRAGMA user_version` is the number applied
last), so a store written by an older gpucloud is upgraded in place when it is opened. The tables
and migrations are in state_schema; the records read back from them are in state_records.

The attempts table holds one row per launch attempt (failover tries several): where, at what
price, when it started and ended and why, and the provider's RunHandle. A run's cost is the sum
over its launched attempts; teardown and node states work from the stored handles.

The resources table is the safety net against leaked machines: providers write an *intent* row
before every cloud call that creates something, so a crash at any point leaves a record that
`down` or `gc` can act on.

With GPUCLOUD_STATE=postgresql://... the same tables live on a PostgreSQL server a team shares
(state/postgres.py, imported only then): the same SQL and migrations, row locks instead of the
file lock, and each run owned by the user who launched it (home.current_user).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucloud.state.guard import (
    begin_immediate,
    check_schema,
    describe_sqlite_error,
    is_busy,
    no_space,
    sqlite_store_error,
    store_error,
    writable_problem,
    write_handle,
)
from gpucloud.state.home import current_user, home_dir, state_url  # noqa: F401  (home_dir: re-exported)
from gpucloud.state.records import (  # noqa: F401  (re-exported: callers import them from here)
    ACTIVE_STATUSES,
    FINAL_STATUSES,
    AttemptRecord,
    EventRecord,
    ResourceRecord,
    RunRecord,
    attempt_from_row,
    run_from_row,
)
from gpucloud.state.schema import MIGRATIONS, RUN_COLUMNS, SCHEMA_VERSION

BUSY_TIMEOUT_MS = 10_000


@dataclass
class _Conn:
    conn: sqlite3.Connection
    lock: threading.RLock = field(default_factory=threading.RLock)


class Store:
    """Access to the state database. One connection per Store, guarded by a lock so the lifecycle's
    helper threads may share it; every write is its own short IMMEDIATE transaction."""

    def __init__(self, path: Path | None = None) -> None:
        """Open (create, upgrade) the store. A store that cannot be used raises StoreError (exit 74)
        naming the file and the command that moves it aside, never a traceback. With no path and
        GPUCLOUD_STATE set, the shared PostgreSQL store (its handle files still under GPUCLOUD_HOME)."""
        self.path = Path(path) if path is not None else home_dir() / "state.db"
        self.location = str(self.path)  # where the runs are, as messages name it
        self._pg: Any = None
        self._phase_order = "rowid"
        url = state_url() if path is None else None
        if url is not None:
            from gpucloud.state.guard import handles_root
            from gpucloud.state.postgres import PgBackend

            self._pg = PgBackend(url, handles_root(self.path))
            self.location, self._phase_order = self._pg.where, "seq"
            return
        self._open_sqlite()

    @property
    def shared(self) -> bool:
        """The store is a team's (PostgreSQL): runs have owners that matter."""
        return self._pg is not None

    def _open_sqlite(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise no_space(exc) or store_error(
                self.path, f"its folder cannot be created ({exc.strerror or exc})"
            ) from None
        if why := writable_problem(self.path):
            raise store_error(self.path, why)
        try:  # created 0600 first: SQLite gives its side files (-wal, -shm) the database's mode
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except OSError:  # it exists (a folder in its place is reported below)
            pass
        try:
            conn = sqlite3.connect(
                str(self.path),
                timeout=BUSY_TIMEOUT_MS / 1000,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.DatabaseError as exc:  # e.g. the path is a folder
            raise sqlite_store_error(self.path, exc) from None
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            self._c = _Conn(conn)
            self._init_schema()
            why = check_schema(conn, SCHEMA_VERSION)
        except sqlite3.DatabaseError as exc:
            if is_busy(exc):
                raise
            if full := no_space(exc, self.path):
                conn.close()
                raise full from None
            why = describe_sqlite_error(exc)
        if why:
            conn.close()  # first: the message lists the side files (-wal, -shm) that are still there
            raise store_error(self.path, why)

    # -- plumbing ---------------------------------------------------------------------------------

    def _init_schema(self) -> None:
        conn = self._c.conn
        # journal_mode needs no transaction; retry while another process holds the file's lock.
        for attempt in range(50):
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as exc:
                if attempt == 49 or not is_busy(exc):
                    raise
                time.sleep(0.05)
        conn.execute("PRAGMA synchronous=NORMAL")
        self._migrate()

    def _migrate(self) -> None:
        """Apply every migration above the file's user_version, each in its own transaction (the
        version is re-read inside it, so two processes opening an old store upgrade it once)."""
        while self._c.conn.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
            with self._tx() as c:
                version = c.execute("PRAGMA user_version").fetchone()[0]
                if version >= SCHEMA_VERSION:
                    break
                for stmt in filter(None, (s.strip() for s in MIGRATIONS[version].split(";"))):
                    c.execute(stmt)
                c.execute(f"PRAGMA user_version={version + 1}")

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        """A short write transaction; BEGIN IMMEDIATE takes the write lock up front, so two
        processes never deadlock upgrading a read lock (the busy timeout makes them queue).
        On PostgreSQL a transaction whose rows are locked by the server as it writes them."""
        if self._pg is not None:
            with self._pg.tx() as session:
                yield session
            return
        with self._c.lock, self._damage_is_store_error():
            conn = self._c.conn
            if conn.in_transaction:  # one cut short by a signal (Ctrl-C) between its BEGIN and its end
                conn.execute("ROLLBACK")
            try:
                begin_immediate(conn, self.path)
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            else:
                conn.execute("COMMIT")

    def transaction(self) -> Any:
        """One write transaction for the state layer's other tables (leases, budgets): a context
        manager yielding something with `execute(sql, args)` in SQLite's dialect."""
        return self._tx()

    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        """Rows read by name (`row["col"]`), for the state layer's other tables."""
        return self._query(sql, args)

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        if self._pg is not None:
            return self._pg.query(sql, args)
        with self._c.lock, self._damage_is_store_error():
            return self._c.conn.execute(sql, args).fetchall()

    @contextmanager
    def _damage_is_store_error(self) -> Iterator[None]:
        """A store damaged after it was opened (a page that cannot be read, a file made read-only)
        gives the same StoreError as one damaged before; a busy lock stays what it is."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            if is_busy(exc) or isinstance(exc, sqlite3.IntegrityError):
                raise
            raise sqlite_store_error(self.path, exc) from None

    def close(self) -> None:
        if self._pg is not None:
            self._pg.close()
            return
        with self._c.lock:
            self._c.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- runs ---------------------------------------------------------------------------------------

    def create_run(
        self,
        run_id: str,
        *,
        name: str,
        spec_path: str | None = None,
        spec: dict[str, Any] | None = None,
        cloud: str | None = None,
        region: str | None = None,
        instance_type: str | None = None,
        num_nodes: int = 1,
        price_per_hour: float = 0.0,
        deadline: float | None = None,
        detached: bool = False,
        pid: int | None = None,
        status: str = "planned",
    ) -> RunRecord:
        now = time.time()
        with self._tx() as c:
            c.execute(
                "INSERT INTO runs (id, name, spec_path, spec_json, cloud, region, instance_type, num_nodes,"
                " price_per_hour, status, created_at, deadline, detached, pid, owner)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    run_id,
                    name,
                    spec_path,
                    json.dumps(spec) if spec is not None else None,
                    cloud,
                    region,
                    instance_type,
                    num_nodes,
                    price_per_hour,
                    status,
                    now,
                    deadline,
                    int(detached),
                    pid,
                    current_user(),
                ),
            )
            c.execute(
                "INSERT INTO events (run_id, ts, kind, message) VALUES (?,?,?,?)",
                (run_id, now, "created", f"run {run_id} recorded"),
            )
        run = self.get_run(run_id)
        assert run is not None
        return run

    def update_run(self, run_id: str, **fields: Any) -> None:
        """Set columns of a run (names as in the runs table)."""
        if not fields:
            return
        bad = set(fields) - set(RUN_COLUMNS)
        if bad:
            raise ValueError(f"unknown run fields: {sorted(bad)}")
        if "detached" in fields:
            fields["detached"] = int(bool(fields["detached"]))
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self._tx() as c:
            c.execute(f"UPDATE runs SET {cols} WHERE id = ?", (*fields.values(), run_id))

    def finish_run(
        self,
        run_id: str,
        status: str,
        *,
        exit_code: int | None = None,
        message: str | None = None,
        only_if_active: bool = False,
        ended_at: float | None = None,
    ) -> bool:
        """Mark a run ended (at `ended_at` when its nodes said when, never later than now). With
        only_if_active, a run another process already finished keeps its status (so `down` does not
        overwrite "succeeded"). Returns whether the row changed."""
        now = time.time() if ended_at is None else min(ended_at, time.time())
        sql = (
            "UPDATE runs SET status = ?, exit_code = COALESCE(?, exit_code), message = COALESCE(?, message),"
            " ended_at = COALESCE(ended_at, ?) WHERE id = ?"
        )
        if only_if_active:
            sql += f" AND status IN ({','.join('?' * len(ACTIVE_STATUSES))})"
        args: tuple[Any, ...] = (status, exit_code, message, now, run_id)
        if only_if_active:
            args += ACTIVE_STATUSES
        with self._tx() as c:
            changed = c.execute(sql, args).rowcount > 0
            if changed:
                c.execute(
                    "INSERT INTO events (run_id, ts, kind, message) VALUES (?,?,?,?)",
                    (run_id, now, "status", f"{status}" + (f" (exit {exit_code})" if exit_code is not None else "")),
                )
        return changed

    def get_run(self, run_id: str) -> RunRecord | None:
        rows = self._query("SELECT * FROM runs WHERE id = ?", (run_id,))
        return self._with_attempts([run_from_row(rows[0])])[0] if rows else None

    def _with_attempts(self, runs: list[RunRecord]) -> list[RunRecord]:
        """Fill each run's attempts (one query for all of them)."""
        if not runs:
            return runs
        by_id = {r.id: r for r in runs}
        marks = ",".join("?" * len(by_id))
        for a in self._query(f"SELECT * FROM attempts WHERE run_id IN ({marks}) ORDER BY run_id, idx", tuple(by_id)):
            by_id[a["run_id"]].attempts.append(attempt_from_row(a))
        return runs

    def find_run(self, ref: str) -> RunRecord | None:
        """A run by exact id, else by unique id prefix, else the newest run of that job name."""
        run = self.get_run(ref)
        if run:
            return run
        rows = self._query(
            "SELECT * FROM runs WHERE id LIKE ? ESCAPE '\\' ORDER BY created_at DESC",
            (ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%",),
        )
        if len(rows) == 1:
            return self.get_run(rows[0]["id"])
        rows = self._query("SELECT id FROM runs WHERE name = ? ORDER BY created_at DESC LIMIT 1", (ref,))
        return self.get_run(rows[0]["id"]) if rows else None

    def list_runs(
        self, *, limit: int | None = None, active_only: bool = False, owner: str | None = None
    ) -> list[RunRecord]:
        """Runs, newest first; with owner, that user's (and the runs from before owners were kept)."""
        where: list[str] = []
        args: tuple[Any, ...] = ()
        if active_only:
            where.append(f"status IN ({','.join('?' * len(ACTIVE_STATUSES))})")
            args = ACTIVE_STATUSES
        if owner is not None:
            where.append("(owner = ? OR owner IS NULL)")
            args += (owner,)
        sql = "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY created_at DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return self._with_attempts([run_from_row(r) for r in self._query(sql, args)])

    # -- attempts -----------------------------------------------------------------------------------

    def start_attempt(
        self,
        run_id: str,
        idx: int,
        *,
        cloud: str,
        region: str,
        instance_type: str | None,
        spot: bool,
        price_per_hour: float,
        num_nodes: int,
        zone: str | None = None,
    ) -> None:
        """Record an attempt before its provision call (its start is when the machines are asked for)."""
        with self._tx() as c:
            c.execute(
                "INSERT INTO attempts (run_id, idx, cloud, region, zone, instance_type, spot,"
                " price_per_hour, num_nodes, started_at) VALUES (?,?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT(run_id, idx) DO UPDATE SET cloud = excluded.cloud, region = excluded.region,"
                " zone = excluded.zone, instance_type = excluded.instance_type, spot = excluded.spot,"
                " price_per_hour = excluded.price_per_hour, num_nodes = excluded.num_nodes,"
                " started_at = excluded.started_at, ended_at = NULL, end_reason = NULL, launched = 0,"
                " handle_json = NULL",
                (run_id, idx, cloud, region, zone, instance_type, int(spot), price_per_hour, num_nodes, time.time()),
            )

    def set_attempt_handle(
        self, run_id: str, idx: int, handle_json: str, *, zone: str | None = None, launched: bool = True
    ) -> None:
        """Store what provision returned: the attempt's machines exist (and bill) from its start.
        The handle goes to a file beside the store first: `down` finds it even if the store breaks."""
        try:
            write_handle(self.path, run_id, idx, handle_json)
        except OSError:
            pass  # the database row below is the primary copy; the file is the spare
        with self._tx() as c:
            c.execute(
                "UPDATE attempts SET handle_json = ?, launched = ?, zone = COALESCE(?, zone)"
                " WHERE run_id = ? AND idx = ?",
                (handle_json, int(launched), zone, run_id, idx),
            )

    def end_attempt(self, run_id: str, idx: int | None, reason: str) -> None:
        """End one attempt (or, with idx None, every open attempt of the run); the first reason stays.
        An attempt of a run that already ended (its VM ended itself; `down` marks the run first)
        ends when the run did, not when a later teardown or gc got to it: that is what it cost."""
        sql = (
            "UPDATE attempts SET ended_at = COALESCE((SELECT ended_at FROM runs WHERE runs.id = attempts.run_id), ?),"
            " end_reason = ? WHERE run_id = ? AND ended_at IS NULL"
        )
        args: tuple[Any, ...] = (time.time(), reason, run_id)
        if idx is not None:
            sql += " AND idx = ?"
            args += (idx,)
        with self._tx() as c:
            c.execute(sql, args)

    def next_attempt_idx(self, run_id: str) -> int:
        """The index of the run's next attempt (attempts are numbered in the order they were made)."""
        row = self._query("SELECT COALESCE(MAX(idx), -1) + 1 AS n FROM attempts WHERE run_id = ?", (run_id,))
        return int(row[0]["n"])

    def attempts(self, run_id: str) -> list[AttemptRecord]:
        return [
            attempt_from_row(r) for r in self._query("SELECT * FROM attempts WHERE run_id = ? ORDER BY idx", (run_id,))
        ]

    # -- events and phases --------------------------------------------------------------------------

    def event(self, run_id: str, kind: str, message: str) -> None:
        with self._tx() as c:
            c.execute(
                "INSERT INTO events (run_id, ts, kind, message) VALUES (?,?,?,?)", (run_id, time.time(), kind, message)
            )

    def events(self, run_id: str) -> list[EventRecord]:
        rows = self._query("SELECT run_id, ts, kind, message FROM events WHERE run_id = ? ORDER BY id", (run_id,))
        return [EventRecord(r["run_id"], r["ts"], r["kind"], r["message"]) for r in rows]

    def set_phase(self, run_id: str, name: str, seconds: float) -> None:
        with self._tx() as c:
            c.execute(
                "INSERT INTO phases (run_id, name, seconds) VALUES (?,?,?)"
                " ON CONFLICT(run_id, name) DO UPDATE SET seconds = excluded.seconds",
                (run_id, name, float(seconds)),
            )

    def set_phases(self, run_id: str, phases: dict[str, float]) -> None:
        if not phases:
            return
        with self._tx() as c:
            c.executemany(
                "INSERT INTO phases (run_id, name, seconds) VALUES (?,?,?)"
                " ON CONFLICT(run_id, name) DO UPDATE SET seconds = excluded.seconds",
                [(run_id, k, float(v)) for k, v in phases.items()],
            )

    def phases(self, run_id: str) -> dict[str, float]:
        rows = self._query("SELECT name, seconds FROM phases WHERE run_id = ? ORDER BY " + self._phase_order, (run_id,))
        return {r["name"]: r["seconds"] for r in rows}

    # -- resources ----------------------------------------------------------------------------------

    def add_resource(self, run_id: str, *, cloud: str, region: str | None, kind: str, name: str | None) -> int:
        now = time.time()
        with self._tx() as c:
            row = c.execute(
                "INSERT INTO resources (run_id, cloud, region, kind, name, status, created_at, updated_at)"
                " VALUES (?,?,?,?,?,?,?,?) RETURNING id",
                (run_id, cloud, region, kind, name, "intent", now, now),
            ).fetchone()
            return int(row["id"])

    def set_resource(self, res_id: int, *, status: str, cloud_id: str | None = None) -> None:
        with self._tx() as c:
            c.execute(
                "UPDATE resources SET status = ?, cloud_id = COALESCE(?, cloud_id), updated_at = ? WHERE id = ?",
                (status, cloud_id, time.time(), res_id),
            )

    def resources(
        self, run_id: str | None = None, *, alive_only: bool = True, cloud: str | None = None
    ) -> list[ResourceRecord]:
        where, args = [], []
        if run_id is not None:
            where.append("run_id = ?")
            args.append(run_id)
        if cloud is not None:
            where.append("cloud = ?")
            args.append(cloud)
        if alive_only:
            where.append("status != 'deleted'")
        sql = "SELECT * FROM resources" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        return [ResourceRecord(**dict(r)) for r in self._query(sql, tuple(args))]

    def clouds_with_resources(self) -> list[str]:
        rows = self._query("SELECT DISTINCT cloud FROM resources WHERE status != 'deleted'")
        return sorted(r["cloud"] for r in rows)


class Journal:
    """What providers write through: an intent row *before* each create call, then created/deleted.
    A crash between the two leaves an intent row, which tells teardown and gc where to look."""

    def __init__(self, store: Store | None = None) -> None:
        self.store = store if store is not None else Store()

    def intent(self, run_id: str, kind: str, name: str, region: str, cloud: str) -> int:
        return self.store.add_resource(run_id, cloud=cloud, region=region, kind=kind, name=name)

    def created(self, res_id: int, cloud_id: str) -> None:
        self.store.set_resource(res_id, status="created", cloud_id=cloud_id)

    def deleted(self, res_id: int) -> None:
        self.store.set_resource(res_id, status="deleted")

    def resources(self, run_id: str, alive_only: bool = True) -> list[ResourceRecord]:
        return self.store.resources(run_id, alive_only=alive_only)

    def event(self, run_id: str, kind: str, message: str) -> None:
        """Providers may note what they did (retries, waits) in the run's event history."""
        self.store.event(run_id, kind, message)
