"""`watch --all`'s gc schedule: two watchers on one store start one `gc` per period between them,
and a SIGTERM ends a watcher cleanly (exit 0, its leases let go)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpucloud.state.leases import GC_LEASE, Leases
from gpucloud.state.runs_db import Store
from tests.support.procs import stop_process

WATCH = [sys.executable, "-m", "gpucloud", "watch", "--all"]


def test_two_watchers_run_one_gc_per_period(tmp_path: Path, gpucloud_home: Path) -> None:
    env = {**os.environ, "GPUCLOUD_WATCH_POLL": "0.3", "GPUCLOUD_WATCH_LEASE": "3", "GPUCLOUD_WATCH_GC_EVERY": "600"}
    watchers = [subprocess.Popen(WATCH, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        time.sleep(8)  # many polls each
        for w in watchers:
            w.send_signal(signal.SIGTERM)
        errs = [w.communicate(timeout=60)[1] for w in watchers]
    finally:
        for w in watchers:
            stop_process(w)
    assert [w.returncode for w in watchers] == [0, 0], errs
    assert sum(e.count("gc started") for e in errs) == 1, errs  # one turn for both, not one per poll
    assert (gpucloud_home / "watch" / "gc.log").exists()
    assert GC_LEASE in Leases(Store()).taken_over()  # the next turn is not before the period is over
