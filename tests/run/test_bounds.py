"""Bounded reads and a busy store, through the CLI on the local provider: a status.json that the
job turns into a link to /dev/zero is refused (the run ends in error and is torn down, no
MemoryError), the file channel never reads a device, a FIFO or an oversized object, and a state
store locked by another process past SQLite's busy timeout is waited for (the finished run still
exits 0 and is torn down)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from gpucloud.channel.run_objects import SMALL_OBJECT_MAX, FileChannel, ObjectRefused, node_prefix
from tests.support.cli import cli, start_cli
from tests.support.hostile_jobs import POISON_STATUS
from tests.support.local_runs import leftovers, run_id_of, write_job
from tests.support.text import flat


def test_status_linked_to_dev_zero_is_refused_and_the_run_torn_down(gpucloud_home: Path, tmp_path: Path) -> None:
    spec = write_job(tmp_path / "job", {"name": "poison", "run": POISON_STATUS})
    t0 = time.monotonic()
    res = cli("run", str(spec), cwd=tmp_path, timeout=90)
    took = time.monotonic() - t0
    assert res.returncode == 65, res.stderr
    assert "status was refused" in res.stderr and "not a regular file" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr.lower()
    assert took < 60, f"took {took:.0f}s"
    run_id = run_id_of(res.stderr)
    assert leftovers(gpucloud_home, run_id) == []


def test_file_channel_reads_are_capped(tmp_path: Path) -> None:
    channel = FileChannel(tmp_path / "store")
    base = node_prefix("r1", 0)
    (tmp_path / "store" / base).mkdir(parents=True)
    status = tmp_path / "store" / base / "status.json"
    status.write_bytes(b"{" + b" " * (SMALL_OBJECT_MAX + 10) + b"}")
    doc = channel.read_status("r1", 0)
    assert doc is not None and doc["state"] == "error" and "larger than its cap" in doc["message"]
    status.unlink()
    os.mkfifo(status)  # opening a FIFO must not wait for a writer
    doc = channel.read_status("r1", 0)
    assert doc is not None and doc["state"] == "error" and "not a regular file" in doc["message"]
    status.unlink()
    status.symlink_to("/dev/zero")
    doc = channel.read_status("r1", 0)
    assert doc is not None and doc["state"] == "error"
    try:
        channel.get_bytes(f"{base}/status.json", limit=100)
    except ObjectRefused as exc:
        assert "a link out of the channel store" in exc.message
    else:
        raise AssertionError("a link to /dev/zero was read")
    status.unlink()
    status.write_text('{"state": "running"}')
    assert channel.read_status("r1", 0) == {"state": "running"}


HOLD = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("ROLLBACK")
"""


def test_store_locked_past_the_busy_timeout_is_waited_for(gpucloud_home: Path, tmp_path: Path) -> None:
    """Another process holds the store's write lock for 14 s (SQLite's busy timeout is 10 s) just
    as the job ends: the run waits, says why, exits 0, records succeeded and tears down."""
    mark = tmp_path / "started"
    spec = write_job(
        tmp_path / "job", {"name": "locked", "env": {"MARK": str(mark)}, "run": 'touch "$MARK"; sleep 2; echo done'}
    )
    run = start_cli("run", str(spec), cwd=tmp_path)
    end = time.monotonic() + 60
    while not mark.exists() and time.monotonic() < end and run.poll() is None:
        time.sleep(0.1)
    assert mark.exists()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(gpucloud_home / "state.db"), "14"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        _, err = run.communicate(timeout=120)
    finally:
        holder.kill()
        holder.wait()
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err
    assert "is locked by another process; waiting" in flat(err)
    run_id = run_id_of(err)
    conn = sqlite3.connect(gpucloud_home / "state.db")
    status = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()[0]
    alive = conn.execute(
        "SELECT COUNT(*) FROM resources WHERE run_id = ? AND status != 'deleted'", (run_id,)
    ).fetchone()[0]
    conn.close()
    assert status == "succeeded" and alive == 0
    assert leftovers(gpucloud_home, run_id) == []
