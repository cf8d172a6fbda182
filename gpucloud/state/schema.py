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

MIGRATIONS: tuple[str, ...] = (_SCHEMA_V1, _SCHEMA_V2)  # MIGRATIONS[i] takes user_version i to i + 1
SCHEMA_VERSION = len(MIGRATIONS)

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
)
