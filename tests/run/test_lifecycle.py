"""Lifecycle pieces without the CLI: the VM engine, the log mirror, outcome mapping, and the
failover loop against fake providers (capacity -> next, quota -> skip region, fatal -> skip cloud)."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpucloud.channel.run_objects import FileChannel, log_key
from gpucloud.contract import registry as providers
from gpucloud.contract.provider import (
    CandidateError,
    CapacityError,
    FatalProvisionError,
    Provider,
    QuotaError,
    RunHandle,
)
from gpucloud.errors import NoCandidateError
from gpucloud.plan.planner import Plan
from gpucloud.providers.local import engine as vm_engine
from gpucloud.run import commands, lifecycle, watch
from gpucloud.run.log import LogMirror
from gpucloud.spec.load import parse_spec
from gpucloud.state.runs_db import Journal, Store
from tests.support.fake_lifecycle import RecordingProvider, fake_run, priced_candidate
from tests.support.local_runs import find_vms

# ---- VM engine ---------------------------------------------------------------------------------------


def test_engine_kills_group_and_escaped_processes(tmp_path: Path) -> None:
    script = "sleep 300 &\nsetsid sleep 301 &\necho up > up.txt\nwait\n"
    vm = vm_engine.boot(
        script, tmp_path / "vm", env={"FOO": "bar"}, path_prefix=[tmp_path / "stubs"], expires_at=time.time() + 60
    )
    deadline = time.monotonic() + 10
    while not (tmp_path / "vm" / "up.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert vm.alive()
    # Another process (say, `gpucloud down`) only has the pid file.
    again = vm_engine.BootedVm.load(tmp_path / "vm")
    assert again is not None and again.pid == vm.pid and again.alive()
    assert len(again.leftovers()) >= 3  # bash, sleep, and the setsid'd sleep
    assert again.kill(grace=2.0)
    vm._reap()
    assert again.leftovers() == [] and not vm.alive() and not again.alive()
    assert not again.kill()  # idempotent


def test_engine_env_and_path_prefix(tmp_path: Path) -> None:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "nvidia-smi").write_text("#!/bin/sh\necho 'Tesla T4'\n")
    (stubs / "nvidia-smi").chmod(0o755)
    os.environ["GPUCLOUD_TEST_SECRET"] = "must-not-leak"
    try:
        vm = vm_engine.boot(
            'nvidia-smi > gpu.txt; echo "$FOO|${GPUCLOUD_TEST_SECRET:-}" > env.txt\n',
            tmp_path / "vm",
            env={"FOO": "a b $c"},
            path_prefix=[stubs],
        )
        assert vm.wait(10)
    finally:
        del os.environ["GPUCLOUD_TEST_SECRET"]
    assert vm.returncode() == 0
    assert (tmp_path / "vm" / "gpu.txt").read_text() == "Tesla T4\n"
    assert (tmp_path / "vm" / "env.txt").read_text() == "a b $c|\n"
    assert find_vms(tmp_path)[0].pid == vm.pid


def test_engine_pid_reuse_is_not_ours(tmp_path: Path) -> None:
    vm = vm_engine.boot("exit 0\n", tmp_path / "vm")
    assert vm.wait(10)
    fake = vm_engine.BootedVm(sandbox=tmp_path / "vm", pid=os.getpid(), start_time="1", booted_at=0)
    assert not fake.alive()  # our own pid, but not the recorded start time


# ---- log mirror -----------------------------------------------------------------------------------------


def _put_part(ch: FileChannel, run_id: str, rank: int, index: int, data: bytes) -> None:
    ch.put_bytes(log_key(run_id, rank, index), data)
    ch.put_bytes(
        f"runs/{run_id}/node-{rank}/status.json", json.dumps({"state": "running", "log_parts": index + 1}).encode()
    )


def test_log_mirror_two_readers_each_part_once(tmp_path: Path) -> None:
    ch = FileChannel(tmp_path / "ch")
    a, b = LogMirror(tmp_path, "r1"), LogMirror(tmp_path, "r1")
    _put_part(ch, "r1", 0, 0, b"one\ntw")
    assert a.sync(ch) == 1
    assert b.sync(ch) == 0
    _put_part(ch, "r1", 0, 1, b"o\n")
    assert b.sync(ch) == 1
    assert a.read_new() == b"one\ntwo\n" and b.read_new() == b"one\ntwo\n"
    assert a.read_new() == b""


def test_log_mirror_multi_node_prefixes_whole_lines(tmp_path: Path) -> None:
    ch = FileChannel(tmp_path / "ch")
    m = LogMirror(tmp_path, "r2", num_nodes=2)
    _put_part(ch, "r2", 0, 0, b"a1\na")
    _put_part(ch, "r2", 1, 0, b"b1\n")
    m.sync(ch)
    assert m.read_new() == b"[node 0] a1\n[node 1] b1\n"
    _put_part(ch, "r2", 0, 1, b"2")
    m.sync(ch, final=True)
    assert m.read_new() == b"[node 0] a2\n"


# ---- outcome ------------------------------------------------------------------------------------------------


def test_outcome_mapping() -> None:
    ok = {"state": "succeeded", "exit_code": 0}
    assert watch.outcome([ok]) == ("succeeded", 0, "")
    assert watch.outcome([{"state": "failed", "exit_code": 3, "message": "m"}])[:2] == ("failed", 3)
    assert watch.outcome([ok, {"state": "deadline", "exit_code": None}])[:2] == ("deadline", 124)
    assert watch.outcome([{"state": "error", "exit_code": None, "message": "gpu"}]) == ("error", 70, "gpu")
    assert watch.outcome([ok, None])[:2] == ("lost", 70)
    phases = watch.vm_phases(
        [
            {
                "stages": {
                    "run": {"start": 10, "end": 13},
                    "setup": {"start": 5, "end": 10},
                    "artifacts": {"start": 13, "end": None},
                }
            }
        ]
    )
    assert list(phases.items()) == [("setup", 5.0), ("run", 3.0)]


def test_run_id_format() -> None:
    rid = lifecycle.new_run_id("my-job", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert re.fullmatch(r"my-job-20260102-030405-[0-9a-f]{4}", rid)


# ---- failover -----------------------------------------------------------------------------------------------


def test_failover_order_and_skips(tmp_path: Path, gpucloud_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucloud.plan.stacks import resolve_stack

    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "job.yaml").write_text("name: fo\nrun: 'true'\nresources: {gpu: T4:1}\n")
    spec = parse_spec((workdir / "job.yaml").read_text(), str(workdir / "job.yaml"))
    spec.source = workdir / "job.yaml"
    calls: list[str] = []
    errors = {
        "us-east-1/g4dn.xlarge": CapacityError("no capacity", code="InsufficientInstanceCapacity"),
        "us-east-1/g4dn.2xlarge": QuotaError("vCPU quota", code="VcpuLimitExceeded", quota_code="L-DB2E81BA"),
        "us-east-2/g4dn.xlarge": CandidateError("Not authorized for images", code="AuthFailure"),
        "us-west-2/g4dn.xlarge": FatalProvisionError("not subscribed", code="OptInRequired"),
        "eastus/Standard_NC4as_T4_v3": CapacityError("AllocationFailed", code="AllocationFailed"),
    }
    fakes = {c: RecordingProvider(c, errors, calls, gpucloud_home) for c in ("aws", "azure")}
    monkeypatch.setattr(providers, "get_provider", lambda cloud, **kw: fakes[cloud])
    plan = Plan(
        spec=spec,
        excluded=[],
        stack=resolve_stack("T4", spec.stack),
        candidates=[
            priced_candidate("aws", "us-east-1", "g4dn.xlarge", 0.5),
            priced_candidate("aws", "us-east-1", "g4dn.2xlarge", 0.7),
            priced_candidate("aws", "us-east-1", "g4dn.4xlarge", 1.2),  # skipped: quota in us-east-1
            priced_candidate("aws", "us-east-2", "g4dn.xlarge", 0.52),  # its image: the next candidate, aws not skipped
            priced_candidate("aws", "us-west-2", "g4dn.xlarge", 0.55),
            priced_candidate("aws", "eu-west-1", "g4dn.xlarge", 0.6),  # skipped: fatal on aws
            priced_candidate("azure", "eastus", "Standard_NC4as_T4_v3", 0.53),
        ],
    )
    run = lifecycle.RunInProgress(spec, plan, detach=False, json_out=False, wait_teardown=True, plan_s=0.0)
    with pytest.raises(NoCandidateError) as info:
        run.execute()
    assert [a.split(":")[0] for a in info.value.attempts] == [
        "aws/us-east-1/g4dn.xlarge",
        "aws/us-east-1/g4dn.2xlarge",
        "aws/us-east-2/g4dn.xlarge",
        "aws/us-west-2/g4dn.xlarge",
        "azure/eastus/Standard_NC4as_T4_v3",
    ]
    assert "L-DB2E81BA" in info.value.attempts[1]
    assert [c for c in calls if c.startswith("provision")] == [
        "provision aws/us-east-1/g4dn.xlarge",
        "provision aws/us-east-1/g4dn.2xlarge",
        "provision aws/us-east-2/g4dn.xlarge",
        "provision aws/us-west-2/g4dn.xlarge",
        "provision azure/eastus/Standard_NC4as_T4_v3",
    ]
    store = Store()
    rec = store.get_run(run.run_id)
    assert rec is not None and rec.status == "no-capacity" and rec.exit_code == 75
    assert store.resources(run.run_id) == []  # every attempt's intent was cleaned up
    assert len(store.resources(run.run_id, alive_only=False)) == 5


def test_a_run_that_launched_nothing_has_no_teardown_to_report(
    tmp_path: Path, gpucloud_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A provider failing before it asked for anything (no journal row, no handle): no teardown runs
    and none is reported as incomplete; the open attempt is ended."""
    run, calls, prov = fake_run(tmp_path / "w", gpucloud_home, monkeypatch)

    def broken_channel(region: str) -> FileChannel:
        raise ValueError("'http://login.example' is an invalid authority")

    monkeypatch.setattr(prov, "channel", broken_channel)
    with pytest.raises(ValueError, match="invalid authority"):
        run.execute()
    err = capsys.readouterr().err
    assert "teardown" not in err, err
    assert not [c for c in calls if c.startswith("teardown")]
    rec = Store().get_run(run.run_id)
    assert rec is not None and all(a.ended_at is not None for a in rec.attempts)


def test_interrupt_during_follow_tears_down(
    tmp_path: Path, gpucloud_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, calls, _ = fake_run(tmp_path / "w", gpucloud_home, monkeypatch)
    # The fake VM never reports; a SIGINT arrives while following.
    orig_sleep = time.sleep
    fired = []

    def sleep(s: float) -> None:
        # time.sleep is global: only the lifecycle's own (main-thread) wait while following fires
        # the signal, not a background thread left by another test module (simulators, servers)
        # nor subprocess's polling inside pack_workdir before the provision.
        following = sys._getframe(1).f_code.co_name == "_follow"
        if not fired and following and threading.current_thread() is threading.main_thread():
            fired.append(1)
            os.kill(os.getpid(), signal.SIGINT)
        orig_sleep(min(s, 0.01))

    monkeypatch.setattr(lifecycle.time, "sleep", sleep)
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when pytest itself runs as a background job
    result = run.execute()
    assert result.exit_code == 130 and result.status == "interrupted"
    assert calls[-1] == "teardown aws/us-east-1"
    assert Store().resources(run.run_id) == []
    assert signal.getsignal(signal.SIGINT) is before  # the run restores the caller's handler


def _spec_in(tmp_path: Path, name: str):  # type: ignore[no-untyped-def]
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "job.yaml").write_text(f"name: {name}\nrun: 'true'\nresources: {{gpu: T4:1}}\n")
    spec = parse_spec((workdir / "job.yaml").read_text(), str(workdir / "job.yaml"))
    spec.source = workdir / "job.yaml"
    return spec


def test_failover_records_attempts_and_costs_only_the_launched_one(
    tmp_path: Path, gpucloud_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two attempts: the first fails for capacity (launched nothing, $0), the second launches; its
    stored handle is what `down` tears down, and the cost is that attempt's price x nodes x hours."""
    from gpucloud.plan.stacks import resolve_stack

    spec = _spec_in(tmp_path, "cost")
    calls: list[str] = []
    prov = RecordingProvider("aws", {"us-east-1/g4dn.xlarge": CapacityError("no capacity")}, calls, gpucloud_home)
    monkeypatch.setattr(providers, "get_provider", lambda cloud, **kw: prov)
    plan = Plan(
        spec=spec,
        excluded=[],
        stack=resolve_stack("T4", spec.stack),
        candidates=[
            priced_candidate("aws", "us-east-1", "g4dn.xlarge", 100.0),
            priced_candidate("aws", "us-west-2", "g4dn.xlarge", 3.0),
        ],
    )
    run = lifecycle.RunInProgress(spec, plan, detach=True, json_out=True, wait_teardown=True, plan_s=0.0)
    assert run.execute().status == "detached"
    store = Store()
    first, second = store.attempts(run.run_id)
    assert (first.region, first.launched, first.end_reason) == ("us-east-1", False, "capacity: no capacity")
    assert (second.region, second.launched, second.end_reason) == ("us-west-2", True, None)
    assert RunHandle.from_json(second.handle_json or "") == prov.handles[-1]
    rec = store.get_run(run.run_id)
    assert rec is not None
    assert rec.cost(now=second.started_at + 1800) == pytest.approx(3.0 * 1 * 0.5)  # only the launched one
    commands.down_run(run.run_id, assume_yes=True)
    assert prov.torn[-1] == prov.handles[-1] and prov.torn[-1].complete
    assert [a.end_reason for a in store.attempts(run.run_id)] == ["capacity: no capacity", "teardown"]


def test_a_provision_that_crashed_is_torn_down_from_a_partial_handle(
    tmp_path: Path, gpucloud_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """provision died after its intent row and before returning a handle: teardown gets a handle
    rebuilt from the journal (complete=False) naming what was being created; the run costs $0."""
    from gpucloud.plan.stacks import resolve_stack

    spec = _spec_in(tmp_path, "crash")
    prov = RecordingProvider("aws", {"us-east-1/g4dn.xlarge": RuntimeError("bug in the provider")}, [], gpucloud_home)
    monkeypatch.setattr(providers, "get_provider", lambda cloud, **kw: prov)
    plan = Plan(
        spec=spec,
        excluded=[],
        stack=resolve_stack("T4", spec.stack),
        candidates=[priced_candidate("aws", "us-east-1", "g4dn.xlarge", 0.5)],
    )
    run = lifecycle.RunInProgress(spec, plan, detach=False, json_out=True, wait_teardown=True, plan_s=0.0)
    with pytest.raises(RuntimeError):
        run.execute()
    assert len(prov.torn) == 1 and not prov.torn[0].complete
    assert prov.torn[0].resources == {"instance": ["us-east-1/g4dn.xlarge"]}
    rec = Store().get_run(run.run_id)
    assert rec is not None and rec.status == "error" and rec.cost() == 0.0 and Store().resources(run.run_id) == []


def test_local_gc_kills_expired_nodes_only(gpucloud_home: Path) -> None:
    from gpucloud.providers.local.provider import LocalProvider

    prov = LocalProvider()
    assert isinstance(prov, Provider) and not providers.info(prov.name).priced
    old = vm_engine.boot("sleep 300\n", prov.sandbox("old-run", 0), expires_at=time.time() - 5)
    new = vm_engine.boot("sleep 300\n", prov.sandbox("new-run", 0), expires_at=time.time() + 600)
    try:
        lines = prov.gc(datetime.now(UTC), dry_run=True)
        assert len(lines) == 1 and "old-run" in lines[0] and "would kill" in lines[0] and old.alive()
        lines = prov.gc(datetime.now(UTC), dry_run=False)
        assert len(lines) == 1 and "killed" in lines[0]
        old._reap()
        assert not old.alive() and new.alive()
        assert prov.node_states(RunHandle("new-run", "local", "local")) == ["running"]
        assert prov.node_states(RunHandle("old-run", "local", "local")) == ["gone"]
    finally:
        new.kill(grace=1)


def test_collect_garbage_tears_down_ended_runs_with_resources(
    gpucloud_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpucloud.providers.local.provider import LocalProvider

    prov = LocalProvider()
    store = Store()
    journal = Journal(store)
    store.create_run("left-1", name="left", cloud="local", region="local")
    res = journal.intent("left-1", "process", "left-1/node-0", "local", "local")
    vm = vm_engine.boot("sleep 300\n", prov.sandbox("left-1", 0), expires_at=time.time() + 600)
    journal.created(res, f"pid:{vm.pid}")
    store.finish_run("left-1", "succeeded", exit_code=0)  # e.g. a `run` killed with SIGKILL at the very end
    commands.collect_garbage(dry_run=True, assume_yes=True, cloud="local")
    assert "would be torn down" in capsys.readouterr().out and vm.alive()
    commands.collect_garbage(dry_run=False, assume_yes=True, cloud="local")
    assert "torn down" in capsys.readouterr().out
    vm._reap()
    assert not vm.alive() and store.resources("left-1") == []
