"""The state store: runs, resources (intent before create), events, phases, cost; concurrent writers."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucloud.contract.provider import RunHandle
from gpucloud.state.runs_db import Journal, Store, home_dir

pytestmark = pytest.mark.usefixtures("backend")  # every test on SQLite and on PostgreSQL (conftest.py)


def test_home_dir_honours_env(gpucloud_home: Path, backend: str) -> None:
    assert home_dir() == gpucloud_home
    store = Store()
    assert store.path == gpucloud_home / "state.db"  # the handle files' place on both backends
    if backend == "sqlite":
        assert not store.shared and store.location == str(store.path)
        mode = store._query("PRAGMA journal_mode")[0][0]
        assert mode == "wal"
    else:
        assert store.shared and store.location.startswith("postgresql://") and not store.path.exists()


def test_run_lifecycle_and_cost(gpucloud_home: Path) -> None:
    store = Store()
    run = store.create_run(
        "job-1",
        name="job",
        spec={"name": "job"},
        cloud="aws",
        region="us-east-1",
        instance_type="g4dn.xlarge",
        num_nodes=2,
        price_per_hour=0.5,
        deadline=time.time() + 60,
    )
    assert run.status == "planned" and run.cost() == 0.0 and not run.final
    t0 = time.time() - 3600
    store.start_attempt(
        "job-1",
        0,
        cloud="aws",
        region="us-east-1",
        instance_type="g4dn.xlarge",
        spot=False,
        price_per_hour=0.5,
        num_nodes=2,
    )
    with store._tx() as c:  # the machines were asked for an hour ago
        c.execute("UPDATE attempts SET started_at = ? WHERE run_id = 'job-1'", (t0,))
    store.set_attempt_handle("job-1", 0, '{"run_id": "job-1", "cloud": "aws", "region": "us-east-1"}')
    store.update_run("job-1", status="running", started_at=t0, phase="run")
    run = store.get_run("job-1")
    assert run is not None and run.status == "running"
    assert run.cost(now=t0 + 3600) == pytest.approx(1.0)  # 0.5 $/h x 2 nodes x 1 h
    assert store.finish_run("job-1", "succeeded", exit_code=0)
    # A later `down` must not overwrite the final status.
    assert not store.finish_run("job-1", "down", only_if_active=True)
    run = store.get_run("job-1")
    assert run is not None and run.status == "succeeded" and run.exit_code == 0 and run.final
    assert run.ended_at is not None
    assert run.as_json()["cost"] == pytest.approx(round(0.5 * 2 * (run.ended_at - t0) / 3600, 6))
    with pytest.raises(ValueError):
        store.update_run("job-1", bogus=1)


def test_find_run_by_prefix_and_name(gpucloud_home: Path) -> None:
    store = Store()
    store.create_run("train-20260101-000000-abcd", name="train")
    store.create_run("other_x-20260101-000000-ffff", name="other_x")
    assert store.find_run("train-2026").id == "train-20260101-000000-abcd"  # type: ignore[union-attr]
    assert store.find_run("train").id == "train-20260101-000000-abcd"  # type: ignore[union-attr]
    assert store.find_run("other%") is None  # LIKE wildcards are literal
    assert store.find_run("nope") is None


def test_journal_intent_before_create(gpucloud_home: Path) -> None:
    journal = Journal(Store())
    rid = journal.intent("r1", "instance", "r1-node-0", "us-east-1", "aws")
    [res] = journal.resources("r1")
    assert res.status == "intent" and res.cloud_id is None and res.kind == "instance"
    journal.created(rid, "i-123")
    [res] = journal.resources("r1")
    assert res.status == "created" and res.cloud_id == "i-123"
    assert journal.store.clouds_with_resources() == ["aws"]
    journal.deleted(rid)
    assert journal.resources("r1") == []
    assert [r.status for r in journal.resources("r1", alive_only=False)] == ["deleted"]
    assert journal.store.clouds_with_resources() == []


def test_events_and_phases(gpucloud_home: Path) -> None:
    store = Store()
    store.create_run("r2", name="r")
    store.event("r2", "attempt", "local/local/localhost: ok")
    store.set_phases("r2", {"provision": 0.2, "run": 1.5})
    store.set_phase("r2", "run", 2.0)
    assert store.phases("r2") == {"provision": 0.2, "run": 2.0}
    assert [e.kind for e in store.events("r2")] == ["created", "attempt"]


_WRITER = """
import sys, time
from gpucloud.state.runs_db import Journal, Store
tag = sys.argv[1]
store = Store()
journal = Journal(store)
for i in range(60):
    run_id = f"{tag}-{i}"
    store.create_run(run_id, name=tag)
    rid = journal.intent(run_id, "process", "n", "local", "local")
    journal.created(rid, str(i))
    store.event(run_id, "x", "y")
    store.set_phase(run_id, "run", i)
    store.update_run(run_id, status="running")
    store.finish_run(run_id, "succeeded", exit_code=0)
print("ok")
"""


def test_two_processes_write_concurrently(gpucloud_home: Path) -> None:
    Store()  # schema created by neither writer first: both race on it below anyway
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, tag], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for tag in ("a", "b")
    ]
    for p in procs:
        out, errout = p.communicate(timeout=60)
        assert p.returncode == 0, errout
        assert out.strip() == "ok"
    store = Store()
    runs = store.list_runs()
    assert len(runs) == 120 and all(r.status == "succeeded" for r in runs)
    assert len(store.resources(alive_only=False)) == 120


def test_schema_created_by_racing_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCLOUD_HOME", str(tmp_path / "fresh"))
    code = "; ".join(
        [
            "from gpucloud.state.runs_db import Store",
            "s = Store()",
            "s.create_run(__import__('sys').argv[1], name='n')",
            "print('ok')",
        ]
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, f"r{i}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for i in range(3)
    ]
    for p in procs:
        out, errout = p.communicate(timeout=60)
        assert p.returncode == 0, errout
    assert len(Store().list_runs()) == 3


# ---- migrations and attempts ---------------------------------------------------------------------------


def _launch(
    store: Store,
    run_id: str,
    idx: int,
    *,
    price: float,
    nodes: int,
    started: float,
    launched: bool,
    ended: float | None = None,
    reason: str | None = None,
) -> None:
    """An attempt as the failover loop records it, with its clock moved to `started`."""
    store.start_attempt(
        run_id,
        idx,
        cloud="aws",
        region=f"r{idx}",
        instance_type="g4dn.xlarge",
        spot=False,
        price_per_hour=price,
        num_nodes=nodes,
    )
    with store._tx() as c:
        c.execute("UPDATE attempts SET started_at = ? WHERE run_id = ? AND idx = ?", (started, run_id, idx))
    if launched:
        store.set_attempt_handle(run_id, idx, RunHandle(run_id, "aws", f"r{idx}", attempt=idx).to_json())
    if reason is not None:
        store.end_attempt(run_id, idx, reason)
        with store._tx() as c:
            c.execute("UPDATE attempts SET ended_at = ? WHERE run_id = ? AND idx = ?", (ended, run_id, idx))


def test_cost_is_summed_over_launched_attempts_only(gpucloud_home: Path) -> None:
    store = Store()
    store.create_run("fo-1", name="fo", num_nodes=2, price_per_hour=9.0)
    t0 = time.time() - 7200
    # Attempt 0 failed for capacity (nothing launched); attempt 1 launched: only it costs.
    _launch(store, "fo-1", 0, price=5.0, nodes=2, started=t0, launched=False, ended=t0 + 60, reason="capacity: none")
    _launch(store, "fo-1", 1, price=0.5, nodes=2, started=t0 + 60, launched=True)
    run = store.get_run("fo-1")
    assert run is not None and [a.end_reason for a in run.attempts] == ["capacity: none", None]
    assert run.cost(now=t0 + 60 + 3600) == pytest.approx(1.0)  # 0.5 $/h x 2 nodes x 1 h
    store.end_attempt("fo-1", None, "teardown")
    assert [a.end_reason for a in store.attempts("fo-1")] == ["capacity: none", "teardown"]
    handle = RunHandle.from_json(store.attempts("fo-1")[1].handle_json or "")
    assert (handle.cloud, handle.region, handle.attempt) == ("aws", "r1", 1)


def test_a_run_that_launched_nothing_costs_nothing(gpucloud_home: Path) -> None:
    store = Store()
    store.create_run("nc-1", name="nc", num_nodes=4, price_per_hour=3.0)
    _launch(
        store,
        "nc-1",
        0,
        price=3.0,
        nodes=4,
        started=time.time() - 3600,
        launched=False,
        ended=time.time(),
        reason="quota: vCPU",
    )
    store.finish_run("nc-1", "no-capacity", exit_code=75)
    run = store.get_run("nc-1")
    assert run is not None and run.cost() == 0.0 and run.as_json()["cost"] == 0.0


_V1_ROWS = [
    "INSERT INTO runs (id, name, cloud, region, instance_type, num_nodes, price_per_hour, status, created_at,"
    " started_at, ended_at) VALUES ('old-1', 'old', 'aws', 'us-east-1', 'g4dn.xlarge', 2, 0.5, 'succeeded',"
    " 1000, 1000, 4600)",
    "INSERT INTO runs (id, name, status, created_at) VALUES ('old-2', 'old', 'no-capacity', 2000)",
]


def _version_1_store(gpucloud_home: Path, backend: str) -> Path | None:
    """A store as gpucloud with schema 1 left it, on the test's backend; its path (None: the server's)."""
    from gpucloud.state.schema import _SCHEMA_V1, postgres_migrations

    if backend == "sqlite":
        path = gpucloud_home / "state.db"
        conn = sqlite3.connect(path)
        conn.executescript(_SCHEMA_V1 + ";" + ";".join(_V1_ROWS) + "; PRAGMA user_version=1;")
        conn.close()
        return path
    import os

    import psycopg

    with psycopg.connect(os.environ["GPUCLOUD_STATE"], autocommit=True) as pg:
        for stmt in filter(None, (s.strip() for s in postgres_migrations()[0].split(";"))):
            pg.execute(stmt)
        for row in _V1_ROWS:
            pg.execute(row)
        pg.execute("CREATE TABLE gpucloud_schema (version INTEGER NOT NULL); INSERT INTO gpucloud_schema VALUES (1)")
    return None


def _schema_version(store: Store) -> int:
    if store.shared:
        return int(store._query("SELECT version FROM gpucloud_schema")[0]["version"])
    return int(store._query("PRAGMA user_version")[0][0])


def test_a_version_1_store_is_migrated_in_place(gpucloud_home: Path, backend: str) -> None:
    """A store written by gpucloud with schema 1 (no attempts) opens, upgrades and keeps its costs."""
    from gpucloud.state.schema import SCHEMA_VERSION

    path = _version_1_store(gpucloud_home, backend)
    store = Store(path)
    assert _schema_version(store) == SCHEMA_VERSION >= 3
    assert store.get_run("old-1").owner is None  # type: ignore[union-attr]  # from before owners were kept
    old = store.get_run("old-1")
    assert old is not None and len(old.attempts) == 1 and old.attempts[0].launched
    assert old.cost() == pytest.approx(0.5 * 2 * 1.0)  # the v1 figure: one price, one start, one end
    assert store.get_run("old-2") is not None and store.get_run("old-2").attempts == []  # type: ignore[union-attr]
    store.close()
    assert Store(path).get_run("old-1") is not None  # opening again applies nothing twice


def test_a_late_teardown_does_not_bill_after_the_run_ended(gpucloud_home: Path) -> None:
    """A detached run whose VM ended itself is torn down by gc a day later: its attempt ends when
    the run did, so the cost stops there."""
    store = Store()
    store.create_run("late-1", name="late", num_nodes=1, price_per_hour=2.0)
    t0 = time.time() - 86400
    _launch(store, "late-1", 0, price=2.0, nodes=1, started=t0, launched=True)
    store.finish_run("late-1", "succeeded", exit_code=0)
    with store._tx() as c:  # the VM ended itself an hour after it started
        c.execute("UPDATE runs SET ended_at = ? WHERE id = 'late-1'", (t0 + 3600,))
    store.end_attempt("late-1", None, "teardown")  # gc, a day later
    (attempt,) = store.attempts("late-1")
    assert attempt.ended_at == pytest.approx(t0 + 3600) and attempt.end_reason == "teardown"
    assert store.get_run("late-1").cost() == pytest.approx(2.0)  # type: ignore[union-attr]
