"""The job of the spot-recovery tests (docs/SPOT.md) and the preemptions they drive: the job counts
to N, one step per STEP_S, keeping the count in its checkpoint folder; on SIGTERM (or the preempted
file) it stops where it is. Each attempt prints `resuming at K`, so a test sees that it resumed from
the checkpoint, and the last writes `result.txt` with the count. The checkpoint also counts the
job's starts: from its third start on (the tests preempt at most twice; FAST_FROM in the job's env
moves it) a step takes STEP_S / 20, so the attempt that only has to finish does not count out the
seconds the first two needed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from gpucloud.state.runs_db import Store
from tests.support.cli import cli
from tests.support.polling import wait_until

COUNT_PY = """\
import os, pathlib, signal, sys, time

N = int(os.environ["N"])
STEP = float(os.environ.get("STEP_S", "0.1"))
d = pathlib.Path(os.environ["GPUCLOUD_CHECKPOINT_DIR"])
f = d / "count"
i = int(f.read_text()) if f.exists() else 0
starts = d / "starts"
n_starts = (int(starts.read_text()) if starts.exists() else 0) + 1
starts.write_text(str(n_starts))
if n_starts >= int(os.environ.get("FAST_FROM", "3")):
    STEP = STEP / 20
print(f"resuming at {i}", flush=True)
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
while i < N:
    if stop or os.path.exists(os.environ["GPUCLOUD_PREEMPTED_FILE"]):
        print(f"preempted at {i}", flush=True)
        sys.exit(143)
    time.sleep(STEP)
    i += 1
    tmp = d / "count.tmp"
    tmp.write_text(str(i))
    os.replace(tmp, f)
pathlib.Path("result.txt").write_text(str(i))
print(f"done {i}", flush=True)
"""


def write_count_job(folder: Path, *, n: int, cloud: str, step_s: float = 0.1, extra: dict | None = None) -> Path:
    """job.yaml + count.py in `folder`; `extra` adds or overrides job fields (recovery, resources ...)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "count.py").write_text(COUNT_PY)
    doc = {
        "name": "count",
        "resources": {"cloud": cloud},
        "max_duration": "10m",
        "checkpoint": "ckpt",
        "checkpoint_interval": "1s",
        "recovery": {"on": ["preemption"], "max_restarts": 2},
        "env": {"N": n, "STEP_S": step_s},
        "run": "python3 count.py",
        "artifacts": ["result.txt"],
        **(extra or {}),
    }
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def resumed_at(log: str) -> list[int]:
    """The `resuming at K` values, attempt by attempt."""
    return [int(m) for m in re.findall(r"resuming at (\d+)", log)]


def latest_run(home: Path) -> str | None:
    """The id of the newest run in the state store under `home`, if any."""
    runs = Store(home / "state.db").list_runs()
    return runs[0].id if runs else None


def run_log(home: Path, run_id: str) -> str:
    """The run's log as the CLI keeps it; empty while there is none."""
    try:
        return (home / "runs" / run_id / "log.txt").read_text()
    except OSError:
        return ""


def preempt_when_resumed(
    home: Path, run_id: str, cwd: Path, attempt: int, env: dict[str, str] | None = None, timeout: float = 90
) -> None:
    """Once attempt `attempt` runs and has uploaded a checkpoint of its own, `gpucloud preempt`."""

    def ready() -> bool:
        log = run_log(home, run_id)
        tail = log.split("resuming at")[attempt:] if len(resumed_at(log)) >= attempt else []
        return bool(tail) and "(interval" in tail[-1]

    assert wait_until(ready, timeout), run_log(home, run_id)
    proc = cli("preempt", run_id, cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr


def preempted_twice(
    args: list[str],
    home: Path,
    cwd: Path,
    env: dict[str, str] | None = None,
    run_id: str | None = None,
    timeout: float = 90,
) -> tuple[str, subprocess.CompletedProcess[str]]:
    """Start `python -m ARGS` (a CLI that follows the run), preempt the run once in each of its first
    two attempts, and wait for the CLI's end. Returns the run id and the finished process."""
    proc = subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=cwd,
        text=True,
        env=env or os.environ.copy(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        if run_id is None:
            assert wait_until(lambda: latest_run(home), 60)
            run_id = latest_run(home) or ""
        preempt_when_resumed(home, run_id, cwd, 1, env=env, timeout=timeout)
        preempt_when_resumed(home, run_id, cwd, 2, env=env, timeout=timeout)
        out, err = proc.communicate(timeout=2 * timeout + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return run_id, subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def check_finished_count(home: Path, run_id: str, cwd: Path, n: int, env: dict[str, str] | None = None) -> dict:
    """N correct, resumed from a checkpoint each time, three launched attempts in `cost --json`."""
    assert (cwd / "gpucloud-runs" / run_id / "result.txt").read_text() == str(n)
    starts = resumed_at(run_log(home, run_id))
    assert len(starts) == 3 and starts[0] == 0 and 0 < starts[1] <= starts[2] < n, starts
    proc = cli("cost", run_id, "--json", cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["runs"][0]
    assert report["launched_attempts"] == 3 and len(report["attempts"]) == 3, report
    assert [a["end_reason"].split(":")[0] for a in report["attempts"]] == ["preempted", "preempted", "teardown"]
    assert all(a["nodes"][0]["billed_seconds"] > 0 for a in report["attempts"])
    return report
