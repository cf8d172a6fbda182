"""Budgets per user and team (docs/TEAMS.md): spend cut to the UTC day/month, `budget set`/`ls`,
`cost` against each budget, `run` refusing a launch past a budget on the AWS simulator before
anything is created (exit 77), and `watch --all` taking down the runs of a user who is over."""

from __future__ import annotations

import calendar
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucloud.run.budget import spent_by
from gpucloud.run.budgets import period_start
from gpucloud.state.records import AttemptRecord, RunRecord
from gpucloud.state.runs_db import Store
from tests.support.aws_faults import FAULTS_ENV, Fault, faults_env
from tests.support.aws_runs import aws_env  # noqa: F401
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.cli import cli
from tests.support.local_runs import leftovers
from tests.support.moto_server import Moto, moto, moto_server, tagged_alive  # noqa: F401
from tests.support.polling import wait_until
from tests.support.procs import stop_process
from tests.support.spot_job import write_count_job

NO_GC = {"GPUCLOUD_WATCH_GC_EVERY": "0"}
NOON = float(calendar.timegm((2026, 12, 7, 12, 0, 0)))


def _attempt(started: float, ended: float | None, price: float = 2.0, nodes: int = 1) -> AttemptRecord:
    return AttemptRecord("r", 0, "aws", "us-east-1", None, "t", False, price, nodes, started, ended, None, True, "{}")


def test_spend_is_cut_to_the_period() -> None:
    day, month = period_start("daily", NOON), period_start("monthly", NOON)
    assert (day, month) == (NOON - 12 * 3600, float(calendar.timegm((2026, 12, 1, 0, 0, 0))))
    since_yesterday = _attempt(NOON - 24 * 3600, None)  # still running: 12 h of it are today's
    assert since_yesterday.cost(NOON, since=day) == pytest.approx(24.0)
    assert since_yesterday.cost(NOON, since=month) == pytest.approx(48.0)
    assert _attempt(NOON - 2 * 3600, NOON - 3600, nodes=2).cost(NOON, since=day) == pytest.approx(4.0)
    assert _attempt(day - 7200, day - 3600).cost(NOON, since=day) == 0.0  # yesterday's


def test_a_budget_counts_what_cost_counts() -> None:
    """One spend figure: a run's `cost` (what `gpucloud cost` and max_cost read) cut to the period
    is what budgets sum; an attempt left open in a run that ended stops at the run's end."""
    start = NOON - 30 * 3600
    run = RunRecord(
        id="r", name="r", spec_path=None, spec_json=None, cloud="aws", region="us-east-1", instance_type="t",
        num_nodes=1, price_per_hour=2.0, status="succeeded", phase=None, exit_code=0, message=None,
        created_at=start, started_at=start, ended_at=NOON - 6 * 3600, deadline=None, artifacts_dir=None,
        detached=False, pid=None, owner="ana",
    )  # fmt: skip
    run.attempts = [_attempt(NOON - 30 * 3600, None)]  # its teardown never closed the attempt
    assert run.cost(NOON) == pytest.approx(48.0)  # 24 h at $2, not up to now
    assert spent_by([run], {"ana"}, period_start("daily", NOON), NOON) == pytest.approx(12.0)
    assert spent_by([run], {"bo"}, period_start("daily", NOON), NOON) == 0.0


def _spent(owner: str, run_id: str, dollars: float) -> None:
    """A finished run of `owner` that cost `dollars` in the last hour (state rows only)."""
    os.environ["GPUCLOUD_USER"] = owner
    try:
        store = Store()
        store.create_run(run_id, name="past", price_per_hour=dollars)
        store.start_attempt(run_id, 0, cloud="aws", region="r", instance_type="t", spot=False,
                            price_per_hour=dollars, num_nodes=1)  # fmt: skip
        with store.transaction() as c:
            c.execute("UPDATE attempts SET started_at = ? WHERE run_id = ?", (time.time() - 3600, run_id))
        store.set_attempt_handle(run_id, 0, "{}")
        store.end_attempt(run_id, 0, "teardown")
        store.finish_run(run_id, "succeeded", exit_code=0)
    finally:
        del os.environ["GPUCLOUD_USER"]


def test_budget_set_ls_and_cost_against_each(gpucloud_home: Path) -> None:
    assert cli("budget", "set", "--user", "ana", "--daily", "5", "--monthly", "100").returncode == 0
    assert cli("budget", "set", "--team", "ml", "--daily", "8", "--add", "ana,bo").returncode == 0
    _spent("ana", "a-1", 3.0)
    _spent("bo", "b-1", 6.0)
    state = {
        (b["scope"], b["name"], b["period"]): b for b in json.loads(cli("budget", "ls", "--json").stdout)["budgets"]
    }
    assert state["user", "ana", "daily"]["spent"] == pytest.approx(3.0, rel=1e-3)
    assert (
        state["team", "ml", "daily"]["spent"] == pytest.approx(9.0, rel=1e-3) and state["team", "ml", "daily"]["over"]
    )
    text = " ".join(cli("cost").stdout.split())
    assert "budget team ml (daily): $9.00 of $8.00, OVER" in text and "budget user ana (daily): $3.00 of $5.00" in text
    bad = cli("budget", "set", "--user", "ana", "--team", "ml", "--daily", "1")
    assert bad.returncode == 2 and "exactly one of" in bad.stderr
    assert cli("budget", "set", "--user", "ana", "--daily", "0").returncode == 0  # 0 removes it
    assert ("user", "ana", "daily") not in {
        (b["scope"], b["name"], b["period"]) for b in json.loads(cli("budget", "ls", "--json").stdout)["budgets"]
    }


@pytest.mark.slow
def test_a_launch_past_a_budget_is_refused_before_anything_is_created(
    aws_env: dict[str, str],  # noqa: F811
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    gpucloud_home: Path,
) -> None:
    """ana is over her own budget and bo over his team's: each is refused before anything is created;
    cy, under neither, launches (one launch shows that neither scope holds back anyone else)."""
    assert cli("budget", "set", "--user", "ana", "--daily", "0.05", env=aws_env).returncode == 0
    assert cli("budget", "set", "--team", "ml", "--add", "bo", "--daily", "0.05", env=aws_env).returncode == 0
    job = write_count_job(Path.cwd() / "job", n=10, cloud="aws", extra={"resources": {"cloud": "aws", "gpu": "T4:1"}})
    for user in ("ana", "bo"):  # the user's own budget, then the team's
        env = {**aws_env, "GPUCLOUD_USER": user}
        proc = cli("run", str(job), "--yes", env=env, module="tests.support.aws_cli", timeout=180)
        assert proc.returncode == 77, (user, proc.stderr[-3000:])
        said = " ".join(proc.stderr.split())
        assert "Not launched" in said and "daily budget of $0.05" in said and "Traceback" not in said
        assert Store().list_runs() == [] and tagged_alive(moto) == []  # nothing recorded, nothing created
    other = cli(
        "run", str(job), "--yes", "--detach", env={**aws_env, "GPUCLOUD_USER": "cy"}, module="tests.support.aws_cli"
    )
    assert other.returncode == 0, other.stderr[-3000:]  # another user's launch is not held back
    assert cli("down", other.stdout.strip(), "--yes", env=aws_env, module="tests.support.aws_cli").returncode == 0


@pytest.mark.slow
def test_a_failover_to_a_dearer_candidate_is_checked_against_the_budget(
    aws_env: dict[str, str],  # noqa: F811
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    gpucloud_home: Path,
) -> None:
    """The plan's first candidate fits the budget ($0.526/h x 10 min = $0.088 of $0.10) but has no
    capacity; the next ($0.752/h: $0.125) would pass it: refused before its create, exit 77."""
    assert cli("budget", "set", "--user", "ana", "--daily", "0.10", env=aws_env).returncode == 0
    resources = {"cloud": "aws", "regions": ["us-east-1"], "gpu": "T4:1"}
    job = write_count_job(Path.cwd() / "job", n=10, cloud="aws", extra={"resources": resources})
    full = Fault("RunInstances", "InsufficientInstanceCapacity", times=None, instance_type="g4dn.xlarge")
    env = {**aws_env, "GPUCLOUD_USER": "ana", FAULTS_ENV: faults_env([full])}
    proc = cli("run", str(job), "--yes", env=env, module="tests.support.aws_cli", timeout=180)
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 77, said[-3000:]
    assert "skipping aws/us-east-1/g4dn.2xlarge before launch: Not launched: this run could cost up to $0.13" in said
    assert "daily budget of $0.10" in said and "Tried before it: aws/us-east-1/g4dn.xlarge: capacity" in said
    (run,) = Store().list_runs()
    assert [a.instance_type for a in run.attempts] == ["g4dn.xlarge"]  # no attempt, so no create, for the rest
    assert run.status == "error" and tagged_alive(moto) == []
    assert any(e.kind == "budget" and "g4dn.2xlarge" in e.message for e in Store().events(run.id))


@pytest.mark.slow
def test_the_watcher_takes_down_the_runs_of_a_user_over_budget(tmp_path: Path, gpucloud_home: Path) -> None:
    env = {**os.environ, "GPUCLOUD_USER": "ana"}
    job = write_count_job(tmp_path / "job", n=100000, cloud="local", extra={"recovery": None})
    started = cli("run", str(job), "--detach", env=env, cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    _spent("ana", "past-1", 10.0)
    assert cli("budget", "set", "--user", "ana", "--daily", "5").returncode == 0
    watcher_log = tmp_path / "watcher.log"  # a file, not a pipe nobody reads: a full pipe would stall it
    with watcher_log.open("w") as log:
        watcher = subprocess.Popen(
            [sys.executable, "-m", "gpucloud", "watch", "--all"],
            env={**os.environ, "GPUCLOUD_WATCH_POLL": "0.5", "GPUCLOUD_WATCH_LEASE": "4", **NO_GC},
            cwd=tmp_path,
            stderr=log,
        )
    store = Store()
    try:
        done = lambda: store.get_run(run_id).final and not store.resources(run_id, alive_only=True)  # noqa: E731
        assert wait_until(done, 240), _watch_story(store, run_id, watcher_log, gpucloud_home)
    finally:
        stop_process(watcher, grace=20)
    run = store.get_run(run_id)
    assert run.status == "down", run.status
    assert any(
        e.kind == "budget" and "spent $10.00 of its daily budget of $5.00" in e.message for e in store.events(run_id)
    )
    assert not leftovers(gpucloud_home, run_id)


def _watch_story(store: Store, run_id: str, watcher_log: Path, home: Path) -> str:
    """What the watcher, its child for the run and the run's record say, for a test that waited in vain."""
    run = store.get_run(run_id)
    child_log = home / "watch" / f"{run_id}.log"
    return "\n".join(
        [
            f"run {run_id}: {run.status if run else 'gone'}; alive: {store.resources(run_id, alive_only=True)}",
            *(f"event {e.kind}: {e.message}" for e in store.events(run_id)),
            "watcher:",
            watcher_log.read_text()[-3000:],
            f"child ({child_log}):",
            child_log.read_text()[-3000:] if child_log.exists() else "(no log)",
        ]
    )
