"""`max_cost:` on a cloud simulator (tests/providers/*/test_*_max_cost.py): a spot run preempted
once, whose relaunch spends on top of the first attempt, so the cap, not max_duration, sets the
relaunched attempt's deadline. The node ends the run there by itself (the agent's watchdog), with
what the job saved uploaded as artifacts: the CLI that followed it reports `max-cost`, exit 124,
and so does `collect` when nobody followed the relaunched attempt any more."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpucloud.state.runs_db import Store
from tests.support.cli import cli
from tests.support.polling import wait_until

MAX_DURATION_S = 30
SCRIPT = 'mkdir -p out; echo saved > out/early.txt; trap "exit 143" TERM; while true; do sleep 0.3; done'


def capped_job(path: Path, resources: dict[str, Any], max_cost: float) -> Path:
    """The job: spot, one restart after a preemption, an artifact written at once, then a loop that
    only a deadline or a stop ends."""
    job = {
        "name": "capped",
        "resources": {**resources, "spot": True},
        "recovery": {"on": ["preemption"], "max_restarts": 1},
        "run": SCRIPT,
        "artifacts": ["out/"],
        "max_duration": f"{MAX_DURATION_S}s",
        "max_cost": max_cost,
    }
    path.write_text(json.dumps(job))  # JSON is YAML
    return path


def run_preempted_once(
    module: str, job: Path, env: dict[str, str], home: Path, cwd: Path, first_s: float = 3.0, leave: bool = False
) -> tuple[str, subprocess.CompletedProcess[str]]:
    """`run JOB --json`; `first_s` after the first attempt runs, `preempt RUN`; the CLI's end. With
    `leave`, the CLI is SIGKILLed once the relaunched attempt runs (the laptop closed: nobody
    follows the run any more) and the CompletedProcess is that of the killed CLI."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "run", str(job), "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )
    try:
        store = Store(home / "state.db")
        running = lambda: any(r.status == "running" for r in store.list_runs())  # noqa: E731
        assert wait_until(lambda: running() or proc.poll() is not None, timeout=120)
        run_id = store.list_runs()[0].id
        time.sleep(first_s)  # the first attempt spends a while before it is preempted
        pre = cli("preempt", run_id, env=env, cwd=cwd, module=module, timeout=60)
        assert pre.returncode == 0, pre.stderr
        if leave:
            relaunched = lambda: len(a := store.attempts(run_id)) == 2 and a[1].launched  # noqa: E731
            assert wait_until(lambda: relaunched() and store.get_run(run_id).status == "running", timeout=120)
            proc.kill()
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    return run_id, subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def check_ended_at_the_cap(
    home: Path, run_id: str, done: subprocess.CompletedProcess[str], max_cost: float, price: float, within_s: float
) -> None:
    """Exit 124, status max-cost; the relaunch's node ended the run at the cap (its watchdog, not
    the CLI), within `within_s` of spend (a heartbeat) past it; the artifact back; said once."""
    said = " ".join(done.stderr.split())
    assert done.returncode == 124, said[-3000:]
    doc = json.loads(done.stdout)
    assert doc["status"] == "max-cost", doc
    assert "restart 1 of 1 after preempted" in said, said[-3000:]
    found = re.search(r"max_cost \$[0-9.]+ reached \(spent \$([0-9.]+)\)", said)
    assert found, said[-3000:]
    assert max_cost <= float(found.group(1)) < max_cost + price * within_s / 3600, found.group(0)
    assert "the machine ended the run at it" in said, said[-3000:]  # the node, not the CLI
    assert (Path(doc["artifacts_dir"]) / "out" / "early.txt").read_text() == "saved\n"
    run = Store(home / "state.db").get_run(run_id)
    assert run is not None and run.status == "max-cost" and "max_cost" in (run.message or "")
    second = run.attempts[-1]
    assert run.deadline is not None and run.deadline - second.started_at < MAX_DURATION_S - 1  # the cap's deadline
