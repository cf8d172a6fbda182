"""`gpucloud watch --all` on the AWS simulator: a detached spot run, preempted, is relaunched once by
exactly one of two watchers and finishes, with its result collected and nothing left; a watcher
SIGKILLed in the middle of that relaunch and started again finishes the run all the same."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpucloud.state.runs_db import Store
from tests.support.aws_runs import aws_env  # noqa: F401
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.cli import cli
from tests.support.moto_server import Moto, moto, moto_server, tagged_alive  # noqa: F401
from tests.support.polling import wait_until
from tests.support.procs import stop_process
from tests.support.spot_job import run_log, write_count_job

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
N = 300
MODULE = "tests.support.aws_cli"
FAST = {"GPUCLOUD_WATCH_POLL": "0.5", "GPUCLOUD_WATCH_LEASE": "4", "GPUCLOUD_WATCH_GC_EVERY": "0"}


def _detached_spot_run(env: dict[str, str]) -> str:
    """The first attempt counts 1 s a step (it cannot finish before the test preempts it, however
    slowly a loaded machine gets the watchers going and the log mirrored); the relaunch, 0.05 s."""
    job = write_count_job(
        Path.cwd() / "job",
        n=N,
        cloud="aws",
        extra={
            "resources": {"cloud": "aws", "regions": ["us-east-1"], "gpu": "T4:1", "spot": True},
            "recovery": {"on": ["preemption"], "max_restarts": 2},
            "env": {"N": N, "STEP_S": 1.0, "FAST_FROM": 2},
        },
    )
    started = cli("run", str(job), "--detach", env=env, module=MODULE, timeout=180)
    assert started.returncode == 0, started.stderr[-3000:]
    return started.stdout.strip()


def _watcher(env: dict[str, str], **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", MODULE, "watch", "--all"],
        env={**env, **FAST, **extra},
        cwd=Path.cwd(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _preempt_once_checkpointed(home: Path, run_id: str, env: dict[str, str]) -> None:
    assert wait_until(lambda: "(interval" in run_log(home, run_id), 120), run_log(home, run_id)
    assert cli("preempt", run_id, env=env).returncode == 0


def _attempts(home: Path, run_id: str) -> list:
    return Store(home / "state.db").attempts(run_id)


def _intents(home: Path, run_id: str) -> list:
    """Journal rows of the relaunch's instance still at `intent` (created at AWS, not yet recorded)."""
    return [r for r in Store(home / "state.db").resources(run_id) if r.status == "intent" and r.kind == "instance"]


def _instances_ever(moto: Moto, run_id: str) -> list[str]:  # noqa: F811
    """Every instance EC2 started for the run, terminated or not."""
    ec2 = moto.client("ec2", "us-east-1")
    found = ec2.describe_instances(Filters=[{"Name": "tag:gpucloud-run", "Values": [run_id]}])["Reservations"]
    return [i["InstanceId"] for r in found for i in r["Instances"]]


def _finished(home: Path, run_id: str, timeout: float = 240) -> dict:
    store = Store(home / "state.db")
    assert wait_until(lambda: store.get_run(run_id).final, timeout), store.events(run_id)[-5:]
    report = json.loads(cli("cost", run_id, "--json").stdout)["runs"][0]
    return report


def _nothing_left(moto: Moto, aws_sim: AwsVmSimulator, home: Path, run_id: str) -> None:  # noqa: F811
    aws_sim.wait_idle(30)
    assert tagged_alive(moto, run_id) == [] and aws_sim.leftover_processes() == []
    assert Store(home / "state.db").resources(run_id, alive_only=True) == []


def test_two_watchers_relaunch_a_preempted_detached_run_once(
    aws_env: dict[str, str],  # noqa: F811
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    gpucloud_home: Path,
) -> None:
    run_id = _detached_spot_run(aws_env)
    watchers = [_watcher(aws_env), _watcher(aws_env)]
    try:
        _preempt_once_checkpointed(gpucloud_home, run_id, aws_env)
        report = _finished(gpucloud_home, run_id)
    finally:
        for w in watchers:
            stop_process(w, grace=20)
    outs = [w.communicate()[1] for w in watchers]
    assert all(w.returncode == 0 for w in watchers), outs
    store = Store(gpucloud_home / "state.db")
    run = store.get_run(run_id)
    assert run.status == "succeeded", (run.status, run.message, outs)
    assert report["launched_attempts"] == 2, report  # exactly one relaunch
    assert len(_instances_ever(moto, run_id)) == 2
    takers = {e.message for e in store.events(run_id) if e.kind == "watch" and e.message.startswith("taken by")}
    assert len(takers) == 1, takers  # one watcher did it all
    assert (Path.cwd() / "gpucloud-runs" / run_id / "result.txt").read_text() == str(N)
    assert store.query("SELECT * FROM leases WHERE run_id = ?", (run_id,)) == []
    _nothing_left(moto, aws_sim, gpucloud_home, run_id)


def test_a_watcher_killed_mid_relaunch_and_restarted_loses_and_leaks_nothing(
    aws_env: dict[str, str],  # noqa: F811
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    gpucloud_home: Path,
) -> None:
    """The relaunch's RunInstances is answered (the machine exists and bills) and then stalls in the
    first watcher's child: the watcher is SIGKILLed there, before the child could record a handle."""
    run_id = _detached_spot_run(aws_env)
    stall = [{"operation": "RunInstances", "code": None, "delay": 60, "after": True, "times": 1}]
    first = _watcher(aws_env, GPUCLOUD_TEST_AWS_FAULTS=json.dumps(stall))
    second = None
    try:
        _preempt_once_checkpointed(gpucloud_home, run_id, aws_env)
        assert wait_until(lambda: len(_attempts(gpucloud_home, run_id)) >= 2, 120)  # the relaunch has begun
        # The relaunch's instance exists at EC2 (its security group and role, tagged too, come first: killing
        # the watcher then would leave the relaunch no machine at all, and the run rightly `lost`).
        assert wait_until(lambda: len(_instances_ever(moto, run_id)) >= 2 and _intents(gpucloud_home, run_id), 60)
        relaunch = _attempts(gpucloud_home, run_id)[1]
        assert not relaunch.launched and relaunch.handle_json is None  # in the middle: no handle recorded
        os.kill(first.pid, signal.SIGKILL)
        first.wait(30)
        second = _watcher(aws_env)
        report = _finished(gpucloud_home, run_id)
    finally:
        stop_process(first)
        stop_process(second, grace=20)
    store = Store(gpucloud_home / "state.db")
    run = store.get_run(run_id)
    assert run.status == "succeeded", (run.status, run.message, [a.end_reason for a in run.attempts])
    assert (Path.cwd() / "gpucloud-runs" / run_id / "result.txt").read_text() == str(N)
    _nothing_left(moto, aws_sim, gpucloud_home, run_id)
    # Exactly one relaunch at EC2: the machine the killed child asked for, which the restarted
    # watcher followed to its end (the channel is the run's) and tore down by its tags.
    assert len(_instances_ever(moto, run_id)) == 2
    # The cut-short attempt is billed from its start to the teardown (its machine ran all along).
    assert report["launched_attempts"] == 2 and report["attempts"][1]["cost"] > 0, report


def test_a_relaunch_cut_short_in_provision_is_followed_by_its_own_machine(gpucloud_home: Path) -> None:
    """A restarted watcher's follower asks about the relaunch's machine (a partial handle of the
    attempt, found by its tags), not the preempted attempt's: that one is gone, and taking it for
    the relaunch's made a healthy run `lost` the moment a heartbeat came late (a loaded machine, a
    slow boot)."""
    from types import SimpleNamespace

    from gpucloud.contract.provider import RunHandle
    from gpucloud.run.recovery import launch_of
    from gpucloud.run.watch_all import Watcher
    from gpucloud.state.runs_db import Journal
    from tests.support.render_inputs import make_candidate

    store, run_id = Store(), "cut-short"
    store.create_run(run_id, name="cut", cloud="aws", region="us-east-1", detached=True, status="running")
    for idx in (0, 1):
        store.start_attempt(
            run_id,
            idx,
            cloud="aws",
            region="us-east-1",
            instance_type="g4dn.xlarge",
            spot=True,
            price_per_hour=0.2,
            num_nodes=1,
        )
    first = RunHandle(run_id, "aws", "us-east-1", attempt=0, nodes=["i-0preempted"])
    store.set_attempt_handle(run_id, 0, first.to_json())
    store.end_attempt(run_id, 0, "preempted")
    Journal(store).intent(run_id, "instance", f"gpucloud-{run_id}-node0", "us-east-1", "aws")  # RunInstances asked
    Watcher()._bill_cut_short_attempts(run_id)  # what the restarted watcher does before it spawns the follower
    launch = launch_of(store.get_run(run_id), SimpleNamespace(candidates=[make_candidate("aws", "T4", 1)]))
    assert launch.attempt == 1
    assert launch.handle == RunHandle(run_id, "aws", "us-east-1", attempt=1, complete=False)
