"""The state store's tables: the SQL that creates them and the numbered migrations that upgrade
an older store in place.

The schema grows by numbered migrations (MIGRATIONS; `PRAGMA user_version` is the number applied
last), so a store written by an older gpucloud is upgraded in place when it is opened (Store._migrate).
"""

from __future__ import annotations

_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    spec_path TEXT,
    spec_json TEXT,
    cloud TEXT,
    region TEXT,
    instance_type TEXT,
    num_nodes INTEGER NOT NULL DEFAULT 1,
    price_per_hour REAL NOT NULL DEFAULT 0,
    status TEXT NOT NULL,
    phase TEXT,
    exit_code INTEGER,
    message TEXT,
    created_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    deadline REAL,
    artifacts_dir TEXT,
    detached INTEGER NOT NULL DEFAULT 0,
    pid INTEGER
);
CREATE TABLE IF NOT EXISTS resources (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    cloud TEXT NOT NULL,
    region TEXT,
    kind TEXT NOT NULL,
    name TEXT,
    cloud_id TEXT,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS resources_run ON resources(run_id);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    ts REAL NOT NULL,
    kind TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_run ON events(run_id);
CREATE TABLE IF NOT EXISTS phases (
    run_id TEXT NOT NULL,
    name TEXT NOT NULL,
    seconds REAL NOT NULL,
    PRIMARY KEY (run_id, name)
);
"""

# v2: one row per launch attempt. `launched` = provision returned (the machines exist and bill).
# A v1 run that had started becomes one launched attempt with its one price and start time.
_SCHEMA_V2 = """
CREATE TABLE attempts (
    run_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    cloud TEXT NOT NULL,
    region TEXT NOT NULL,
    zone TEXT,
    instance_type TEXT,
    spot INTEGER NOT NULL DEFAULT 0,
    price_per_hour REAL NOT NULL DEFAULT 0,
    num_nodes INTEGER NOT NULL DEFAULT 1,
    started_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    launched INTEGER NOT NULL DEFAULT 0,
    handle_json TEXT,
    PRIMARY KEY (run_id, idx)
);
INSERT INTO attempts (run_id, idx, cloud, region, instance_type, price_per_hour, num_nodes, started_at,
                      ended_at, end_reason, launched)
    SELECT id, 0, cloud, COALESCE(region, ''), instance_type, price_per_hour, num_nodes, started_at, ended_at,
           CASE WHEN ended_at IS NULL THEN NULL ELSE status END, 1
    FROM runs WHERE started_at IS NOT NULL AND cloud IS NOT NULL
"""

# v3: a shared store. Each run's owner (who launched it: `ls` shows one's own, `ls --all` everyone's;
# runs from before are nobody's and shown to all); watcher leases (one watcher acts on a run at a time,
# until expires_at unless renewed); budgets per user or team and period, and who is in which team.
_SCHEMA_V3 = """
ALTER TABLE runs ADD COLUMN owner TEXT;
CREATE INDEX IF NOT EXISTS runs_owner ON runs(owner);
CREATE TABLE leases (
    run_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    action TEXT,
    expires_at REAL NOT NULL
);
CREATE TABLE budgets (
    scope TEXT NOT NULL,
    name TEXT NOT NULL,
    period TEXT NOT NULL,
    amount REAL NOT NULL,
    set_by TEXT,
    set_at REAL NOT NULL,
    PRIMARY KEY (scope, name, period)
);
CREATE TABLE team_members (
    team TEXT NOT NULL,
    member TEXT NOT NULL,
    PRIMARY KEY (team, member)
)
"""

MIGRATIONS: tuple[str, ...] = (_SCHEMA_V1, _SCHEMA_V2, _SCHEMA_V3)  # MIGRATIONS[i] takes user_version i to i + 1
SCHEMA_VERSION = len(MIGRATIONS)


def postgres_migrations() -> tuple[str, ...]:
    """The same migrations in PostgreSQL's spelling: REAL is 4 bytes there (timestamps need DOUBLE
    PRECISION), AUTOINCREMENT is BIGSERIAL, and phases get a `seq` column to keep their order (SQLite's
    rowid). Derived, not written twice, so the two backends cannot drift apart."""
    import re

    out = []
    for sql in MIGRATIONS:
        sql = sql.replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY")
        sql = re.sub(r"\bREAL\b", "DOUBLE PRECISION", sql)
        if "CREATE TABLE IF NOT EXISTS phases" in sql:
            sql += ";\nALTER TABLE phases ADD COLUMN IF NOT EXISTS seq BIGSERIAL"
        out.append(sql)
    return tuple(out)


RUN_COLUMNS = (
    "id",
    "name",
    "spec_path",
    "spec_json",
    "cloud",
    "region",
    "instance_type",
    "num_nodes",
    "price_per_hour",
    "status",
    "phase",
    "exit_code",
    "message",
    "created_at",
    "started_at",
    "ended_at",
    "deadline",
    "artifacts_dir",
    "detached",
    "pid",
    "owner",
)
