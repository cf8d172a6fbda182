"""A damaged state store, through the real CLI: one clear error with the path and
the `mv` that moves it aside (exit 74, never "internal error"); `down` tears a run down from the
handle files kept beside the store; `gc` sweeps by tags; a run stuck in `planned` is finalised."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucloud.state.runs_db import Store
from tests.support.cli import cli
from tests.support.local_runs import leftovers, run_id_of, write_job
from tests.support.text import flat

STORE_ERROR = 74


def _store_with_history(home: Path) -> Path:
    """A real store with enough rows to span several pages, closed (WAL checkpointed)."""
    with Store() as store:
        for i in range(40):
            store.create_run(f"run-20260101-{i:04x}", name="x" * 200, spec={"pad": "y" * 2000})
    path = home / "state.db"
    assert path.stat().st_size > 8 * 4096 and not Path(f"{path}-wal").exists()
    return path


def _truncate(path: Path) -> None:
    with path.open("r+b") as fh:
        fh.truncate(path.stat().st_size // 3)


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(8192))


def _wrong_schema(path: Path) -> None:
    path.unlink()
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE runs (id TEXT, colour TEXT)")
    conn.execute("PRAGMA user_version=2")
    conn.commit()
    conn.close()


def _newer_schema(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version=99")
    conn.commit()
    conn.close()


def _read_only(path: Path) -> None:
    path.chmod(0o444)


DAMAGE = {
    "truncated": (_truncate, "damaged"),
    "garbage": (_garbage, "not an SQLite database"),
    "wrong schema": (_wrong_schema, "not a gpucloud state store"),
    "newer schema": (_newer_schema, "newer gpucloud"),
    "read-only": (_read_only, "read-only"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_damaged_store_gives_one_clear_error(case: str, gpucloud_home: Path, tmp_path: Path) -> None:
    path = _store_with_history(gpucloud_home)
    damage, why = DAMAGE[case]
    damage(path)
    for args in (["ls"], ["status", "run-20260101-0001"], ["logs", "run-20260101-0001"]):
        proc = cli(*args, cwd=tmp_path)
        assert proc.returncode == STORE_ERROR, (args, proc.returncode, proc.stderr)
        assert f"The state store {path} cannot be used" in flat(proc.stderr) and why in flat(proc.stderr), proc.stderr
        assert f"mv {path} {path}.damaged-" in flat(proc.stderr), proc.stderr
        assert "Traceback" not in flat(proc.stderr) and "internal error" not in flat(proc.stderr).lower()
    if case == "read-only":
        assert f"chmod u+w {path}" in flat(proc.stderr)
        return
    mv = next(line.strip() for line in proc.stderr.splitlines() if line.strip().startswith("mv "))
    subprocess.run(mv, shell=True, check=True)  # the command the message gives works, and then so does gpucloud
    assert cli("ls", cwd=tmp_path).returncode == 0


def test_gc_with_a_damaged_store_sweeps_by_tags(gpucloud_home: Path, tmp_path: Path) -> None:
    path = _store_with_history(gpucloud_home)
    _garbage(path)
    proc = cli("gc", "--yes", "--cloud", "local", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"The state store {path} cannot be used" in flat(proc.stderr) and "tags only" in flat(proc.stderr)


def test_down_uses_the_handle_file_when_the_store_is_damaged(gpucloud_home: Path, tmp_path: Path) -> None:
    job = write_job(tmp_path / "job", {"name": "sleeper", "run": "sleep 300"})
    proc = cli("run", str(job), "--detach", "--yes", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    run_id = run_id_of(proc.stderr)
    deadline = time.monotonic() + 60
    while not leftovers(gpucloud_home, run_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert leftovers(gpucloud_home, run_id), "the run never started"
    handle = gpucloud_home / "runs" / run_id / "handle-0.json"
    assert json.loads(handle.read_text())["run_id"] == run_id
    _garbage(gpucloud_home / "state.db")
    proc = cli("down", run_id, "--yes", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "torn down from its handle files" in flat(proc.stderr) and "cannot be used" in flat(proc.stderr)
    assert leftovers(gpucloud_home, run_id) == []


def test_down_without_store_or_handle_file_says_so(gpucloud_home: Path, tmp_path: Path) -> None:
    _garbage(_store_with_history(gpucloud_home))
    proc = cli("down", "run-20260101-0001", "--yes", cwd=tmp_path)
    assert proc.returncode == STORE_ERROR and "no run handle files" in flat(proc.stderr), proc.stderr
    assert "gpucloud gc" in flat(proc.stderr) and "Traceback" not in flat(proc.stderr)


def test_run_stuck_in_planned_is_finalised_by_status(gpucloud_home: Path, tmp_path: Path) -> None:
    with Store() as store:
        store.create_run("run-20260101-dead", name="killed", cloud="local", region="local", pid=None)
        store.create_run(
            "run-20260101-slow", name="starting", cloud="local", region="local", pid=None, status="provisioning"
        )
        store.update_run("run-20260101-dead", created_at=time.time() - 3600)
    doc = json.loads(cli("status", "run-20260101-dead", "--json", cwd=tmp_path, check=True).stdout)
    assert doc["status"] == "error" and "before any machine was created" in doc["message"]
    young = json.loads(cli("status", "run-20260101-slow", "--json", cwd=tmp_path, check=True).stdout)
    assert young["status"] == "provisioning"  # within the grace period: not yet


def test_handle_is_written_beside_the_store(gpucloud_home: Path) -> None:
    with Store() as store:
        store.create_run("run-20260101-abcd", name="x")
        store.start_attempt(
            "run-20260101-abcd",
            0,
            cloud="local",
            region="local",
            instance_type=None,
            spot=False,
            price_per_hour=0.0,
            num_nodes=1,
        )
        store.set_attempt_handle("run-20260101-abcd", 0, '{"run_id": "run-20260101-abcd"}')
    assert (
        gpucloud_home / "runs" / "run-20260101-abcd" / "handle-0.json"
    ).read_text() == '{"run_id": "run-20260101-abcd"}'


def test_store_that_breaks_during_a_run_still_tears_it_down(
    tmp_path: Path, gpucloud_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's own teardown falls back to the handle file when the store fails mid-run."""
    from contextlib import contextmanager

    from gpucloud.run import lifecycle
    from gpucloud.state.guard import StoreError, store_error
    from tests.support.fake_lifecycle import fake_run

    run, calls, prov = fake_run(tmp_path / "w", gpucloud_home, monkeypatch)

    def broken_query(self: Store, *args: object) -> list[object]:
        raise store_error(self.path, "the database file is damaged (truncated or corrupted)")

    @contextmanager
    def broken_tx(self: Store):  # type: ignore[no-untyped-def]
        raise store_error(self.path, "the database file is damaged (truncated or corrupted)")
        yield

    def sleep(s: float) -> None:  # the store breaks while the run is being followed (not before)
        if sys._getframe(1).f_code.co_name != "_follow":
            return
        monkeypatch.setattr(Store, "_query", broken_query)
        monkeypatch.setattr(Store, "_tx", broken_tx)

    monkeypatch.setattr(lifecycle.time, "sleep", sleep)
    with pytest.raises(StoreError):
        run.execute()
    assert calls[-1] == "teardown aws/us-east-1" and prov.torn[-1].nodes == ["id-1"]
