"""`max_cost:` (gpucloud/run/budget.py): the job-file field, `spent` (the one answer to "what has
this run spent so far", reused by budgets), the deadline it sets each attempt (the node's watchdog
ends the run there with its artifacts: tests/vm/test_agent_units.py) and the end a follower gives a
run, on the state store and the local provider (a machine of your own costs $0 an hour: max_cost
never ends a local run)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from gpucloud.run import budget
from gpucloud.run.watch import outcome
from gpucloud.spec.load import parse_spec
from gpucloud.spec.values import SpecError
from gpucloud.state.runs_db import Store
from tests.support.cli import cli
from tests.support.polling import wait_until


def test_max_cost_is_a_job_field_checked_with_its_line() -> None:
    head = "name: m\nresources: {cloud: aws, gpu: 'T4:1'}\nrun: x\n"
    spec = parse_spec(head + "max_duration: 10h\nmax_cost: 3\n", "j.yaml")
    assert spec.max_cost == 3.0
    assert spec.price_cap() == (0.3, "max_cost $3 over 10 h x 1 node(s)")
    both = parse_spec(
        "name: m\nresources: {cloud: aws, gpu: 'T4:1', max_price_per_hour: 0.2}\nrun: x\nmax_duration: 10h\n"
        "max_cost: 3\n",
        "j.yaml",
    )
    assert both.price_cap() == (0.2, "max_price_per_hour")  # the lower cap holds
    for bad in ("-1", "0", "lots", ".nan"):
        with pytest.raises(SpecError) as exc:
            parse_spec(f"name: m\nrun: x\nmax_cost: {bad}\n", "j.yaml")
        assert "j.yaml:3: max_cost" in str(exc.value), str(exc.value)


def test_spent_sums_the_attempts_and_over_ends_at_the_cap(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.create_run("r-1", name="r", num_nodes=2)
    where = {"cloud": "aws", "region": "us-east-1", "instance_type": "x"}
    store.start_attempt("r-1", 0, **where, spot=True, price_per_hour=1.8, num_nodes=2)
    store.set_attempt_handle("r-1", 0, "{}")
    start = store.attempts("r-1")[0].started_at
    assert budget.spent(store, "r-1", start + 100) == pytest.approx(1.8 * 2 * 100 / 3600)  # $0.1
    said: list[str] = []
    assert budget.over(store, "r-1", 0.2, said.append, start + 100) is None and said == []
    assert budget.over(store, "r-1", None, said.append, start + 10**6) is None
    status, code, message = budget.over(store, "r-1", 0.2, said.append, start + 200) or ("", 0, "")
    assert (status, code) == ("max-cost", 124) and "max_cost $0.2 reached (spent $0.2000)" in message
    assert said == [message]
    assert budget.spent(store, "no-such-run") == 0.0


def test_a_local_run_with_max_cost_runs_to_its_end(tmp_path: Path, gpucloud_home: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: free\nresources: {cloud: local}\nrun: echo done\nmax_duration: 1m\nmax_cost: 0.01\n")
    out = cli("run", str(job), "--json", cwd=tmp_path)
    assert out.returncode == 0 and json.loads(out.stdout)["status"] == "succeeded", out.stderr
    runs = Store(gpucloud_home / "state.db").list_runs()
    assert budget.spent(Store(gpucloud_home / "state.db"), runs[0].id) == 0.0


def _attempt_on(store: Store, run_id: str, idx: int, price: float, nodes: int, ago: float) -> None:
    where = {"cloud": "aws", "region": "us-east-1", "instance_type": "x"}
    store.start_attempt(run_id, idx, **where, spot=True, price_per_hour=price, num_nodes=nodes)
    with store.transaction() as c:
        c.execute("UPDATE attempts SET started_at = ? WHERE run_id = ? AND idx = ?", (time.time() - ago, run_id, idx))


def test_the_cap_is_the_attempts_deadline(tmp_path: Path) -> None:
    """The node holds max_cost: each attempt's deadline is min(max_duration, what the cap leaves at
    its price), counting the attempt from its request (as `spent` will) and what earlier ones spent."""
    store = Store(tmp_path / "state.db")
    store.create_run("r-1", name="r", num_nodes=2)
    _attempt_on(store, "r-1", 0, 1.8, 2, ago=100)  # $3.6/h for 100 s: $0.1, then preempted
    store.set_attempt_handle("r-1", 0, "{}")
    store.end_attempt("r-1", 0, "preempted")
    _attempt_on(store, "r-1", 1, 1.8, 2, ago=10)  # the relaunch, requested 10 s ago, not launched yet
    now = time.time()
    seconds, why = budget.attempt_limit(store, "r-1", 3600, 0.2, 3.6, now)
    assert why == "max_cost $0.2 reached" and seconds == pytest.approx(100 - 10, abs=1.01)
    assert budget.attempt_limit(store, "r-1", 60, 0.2, 3.6, now) == (60, "")  # max_duration comes first
    assert budget.attempt_limit(store, "r-1", 3600, None, 3.6, now) == (3600, "")
    assert budget.attempt_limit(store, "r-1", 3600, 0.2, 0.0, now) == (3600, "")  # a $0 machine


def test_a_follower_leaves_the_end_at_the_cap_to_the_node(tmp_path: Path) -> None:
    """Spend at the cap ends the run from the CLI only once the node had NODE_GRACE_S past its
    deadline to end it itself (with its artifacts); a node's own end reads as max-cost."""
    store = Store(tmp_path / "state.db")
    store.create_run("r-1", name="r", num_nodes=1)
    _attempt_on(store, "r-1", 0, 3.6, 1, ago=0)
    store.set_attempt_handle("r-1", 0, "{}")
    start = store.attempts("r-1")[0].started_at
    store.update_run("r-1", deadline=start + 200)
    said: list[str] = []
    assert budget.over(store, "r-1", 0.2, said.append, start + 200 + budget.NODE_GRACE_S - 1) is None
    ended = budget.over(store, "r-1", 0.2, said.append, start + 200 + budget.NODE_GRACE_S + 1)
    assert ended is not None and ended[:2] == ("max-cost", 124) and len(said) == 1
    node = {"state": "deadline", "exit_code": None, "message": "max_cost $0.2 reached (deadline 2026-12-07T12:00:00Z)"}
    assert outcome([node]) == ("max-cost", 124, node["message"])
    status, code, message = budget.node_end(outcome([node]), store, "r-1", said.append)
    assert (status, code) == ("max-cost", 124) and re.match(r"max_cost \$0.2 reached \(spent \$[0-9.]+\)", message)
    plain = {**node, "message": "max_duration passed (deadline 2026-12-07T12:00:00Z)"}
    assert (
        outcome([plain])[0] == "deadline"
        and budget.node_end(outcome([plain]), store, "r-1", said.append)[0] == "deadline"
    )


def test_a_detached_run_found_ended_is_billed_to_its_nodes_end(tmp_path: Path, gpucloud_home: Path) -> None:
    """A run nobody followed ends (for `cost`, max_cost and budgets) when its node said it ended, not
    when `status` or `ls` first saw it."""
    job = tmp_path / "job.yaml"
    job.write_text("name: d\nresources: {cloud: local}\nrun: echo done\nmax_duration: 1m\n")
    run_id = json.loads(cli("run", str(job), "--detach", "--json", cwd=tmp_path, check=True).stdout)["run_id"]
    store = Store(gpucloud_home / "state.db")
    [proc] = [r for r in store.resources(run_id, alive_only=False) if r.kind == "process"]
    pid = int(str(proc.cloud_id).split(":")[1])
    assert wait_until(lambda: not os.path.exists(f"/proc/{pid}"), timeout=60)
    time.sleep(2.0)  # the run ended well before anyone looks
    looked = time.time()
    assert json.loads(cli("status", run_id, "--json", cwd=tmp_path, check=True).stdout)["status"] == "succeeded"
    run = store.get_run(run_id)
    assert run is not None and run.ended_at is not None and run.ended_at < looked - 1.5, (run.ended_at, looked)
    assert run.attempts[0].ended_at == run.ended_at


def test_a_preempted_attempt_with_max_cost_spent_ends_the_run_at_its_cap(tmp_path: Path) -> None:
    """Recovery would relaunch, but the cap is spent: the run ends `max-cost` (124, as the node's own
    end at the cap), not as a launch the budget refused (77), and nothing is provisioned."""
    from types import SimpleNamespace

    from gpucloud.run.recovery import Recovery
    from gpucloud.state.runs_db import Journal

    store = Store(tmp_path / "state.db")
    store.create_run("r-2", name="r")
    where = {"cloud": "aws", "region": "us-east-1", "instance_type": "x"}
    store.start_attempt("r-2", 0, **where, spot=True, price_per_hour=3.6, num_nodes=1)
    store.set_attempt_handle("r-2", 0, "{}")
    with store.transaction() as c:  # the attempt began 400 s ago: $0.40 spent
        c.execute("UPDATE attempts SET started_at = started_at - 400 WHERE run_id = 'r-2'")
    head = "name: j\nresources: {cloud: aws, gpu: 'T4:1'}\nrun: x\nmax_cost: 0.3\n"
    spec = parse_spec(head + "recovery: {on: [preemption], max_restarts: 2}\n", "j.yaml")
    said: list[str] = []
    progress = SimpleNamespace(warn=said.append, info=lambda *_: None)
    rec = Recovery(spec, None, "r-2", store, Journal(store), progress)  # type: ignore[arg-type]
    launch = SimpleNamespace(attempt=0, candidate=SimpleNamespace(spot=True))
    assert rec.relaunch(launch, "preempted", "preempted: spot notice") is None  # type: ignore[arg-type]
    status, code, message = rec.spent_out or ("", 0, "")
    assert (status, code) == ("max-cost", 124), rec.spent_out
    assert "max_cost $0.3 reached (spent $0.4" in message and "not relaunched after preempted" in message
    assert said == [message] and rec.restarts == 0
    assert store.attempts("r-2")[0].end_reason.startswith("preempted")
