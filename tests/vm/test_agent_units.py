"""The agent's deadlines, retries and races, with a fake clock and a fake channel (milliseconds
each): the cells of the VM fault matrix (tests/vm/test_vm_faults.py) seen from inside the agent."""

from __future__ import annotations

import io
import json
import os
import tarfile
import threading
import time
from pathlib import Path

import pytest

from gpucloud.vm import protocol
from gpucloud.vm.agent.agent import Agent
from gpucloud.vm.agent.barrier import Barrier
from gpucloud.vm.agent.checkpoints import Checkpoints
from gpucloud.vm.agent.clock import Clock
from gpucloud.vm.agent.config import JobConfig
from gpucloud.vm.agent.ending import AgentExit, StandDown
from gpucloud.vm.agent.final import FinalGate
from gpucloud.vm.agent.guard import Guard
from gpucloud.vm.agent.heartbeat import Heartbeat
from gpucloud.vm.agent.hooks import AwsSpotHooks, AzureHooks, Hooks, hooks_for
from gpucloud.vm.agent.logpump import FAILED, MORE, NOTHING, SENT, LogPump
from gpucloud.vm.agent.safe_extract import RATIO_FLOOR, Refused, safe_untar
from gpucloud.vm.agent.stage_api import StageFailed
from gpucloud.vm.agent.uploads import AppendUpload, DirUpload, PostUpload, log_upload
from tests.support.agent_fakes import FakeClock, FakeTransfer

MANIFEST = (
    "deadline {deadline}\nstatus_put mem://status\nartifacts_put mem://art\nlog_dir mem://log\n"
    "notice_get mem://notice\nready_put mem://ready-0\nready_get 0 mem://ready-0\nready_get 1 mem://ready-1\n"
)


def make_agent(tmp: Path, clock: Clock | None = None, deadline_in: int = 3, **cfg: object) -> Agent:
    clock = clock or FakeClock()
    transfer = FakeTransfer(sleep=clock.sleep)
    timing = {"max_duration": 10, "tick_s": 1.0, "log_s": 1.0, "heartbeat_s": 5.0}
    config = JobConfig(run_id="run-1", **timing, **cfg)  # type: ignore[arg-type]
    codes: list[int] = []
    agent = Agent(
        config,
        tmp / "vm",
        manifest_url="mem://manifest",
        clock=clock,
        transfer=transfer,
        environ={"PATH": os.environ["PATH"]},
        exit=codes.append,
    )
    agent.codes = codes  # type: ignore[attr-defined]
    agent.make_dirs()
    deadline = int(clock.now()) + deadline_in
    transfer.store["mem://manifest"] = MANIFEST.format(deadline=deadline).encode()
    agent.manifest = protocol.parse_manifest(MANIFEST.format(deadline=deadline))
    agent.deadline.at = deadline
    return agent


def status(agent: Agent) -> dict:
    return json.loads(agent.transfer.store["mem://status"])  # type: ignore[attr-defined]


# ---- deadlines -----------------------------------------------------------------------------------
def test_watchdog_fires_within_a_tick_of_the_deadline_and_reports_deadline(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, deadline_in=3)
    clock = agent.clock
    agent.watchdog_process()
    assert agent.deadline.at <= clock.now() < agent.deadline.at + agent.cfg.tick_s + 0.01
    doc = status(agent)
    assert (doc["state"], doc["exit_code"], doc["stage"]) == ("deadline", None, "done")
    assert doc["message"].startswith("max_duration passed (deadline ")
    assert agent.codes == [124]  # type: ignore[attr-defined]


def test_the_agent_ends_at_a_max_cost_deadline_with_what_the_job_saved(tmp_path: Path) -> None:
    """The watchdog at a deadline max_cost set says so and uploads the artifacts first, as a stop
    does; at max_duration's it does not (unchanged)."""
    agent = make_agent(tmp_path, clock=Clock(), deadline_in=0, artifacts=["out"], deadline_why="max_cost $3 reached")
    agent.log_path.touch()
    agent.runner.start(
        "mkdir -p out; trap 'echo saved > out/a; exit 7' TERM; while :; do sleep 0.02; done", agent.job_env()
    )
    time.sleep(0.2)
    assert agent.end_at_deadline()
    doc = status(agent)
    assert (doc["state"], doc["stage"]) == ("deadline", "done") and doc["message"].startswith(
        "max_cost $3 reached (deadline "
    )
    assert doc["artifacts_sha256"] and "mem://art" in agent.transfer.store  # type: ignore[attr-defined]
    plain = make_agent(tmp_path / "plain", clock=Clock(), deadline_in=0, artifacts=["out"])
    plain.log_path.touch()
    plain.runner.start("mkdir -p out; echo x > out/a; sleep 30", plain.job_env())
    time.sleep(0.2)
    assert plain.end_at_deadline() and "mem://art" not in plain.transfer.store  # type: ignore[attr-defined]
    assert status(plain)["message"].startswith("max_duration passed (deadline ")


def test_manifest_deadline_lowers_but_never_raises(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, deadline_in=100)
    at = agent.deadline.at
    assert not agent.deadline.lower(at + 50)
    assert agent.deadline.lower(at - 50)
    assert agent.deadline.at == at - 50
    assert (agent.st / "deadline").read_text() == str(at - 50)


def test_manifest_is_retried_with_backoff_until_the_deadline(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, deadline_in=200)
    del agent.transfer.store["mem://manifest"]  # type: ignore[attr-defined]
    with pytest.raises(AgentExit, match="cannot fetch the manifest"):
        agent.fetch_manifest("mem://manifest")
    assert agent.clock.sleeps[:8] == [1, 4, 9, 16, 25, 36, 49, 60]  # type: ignore[attr-defined]
    assert agent.clock.now() >= agent.deadline.at


def test_manifest_found_on_a_later_try(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, deadline_in=200)
    transfer: FakeTransfer = agent.transfer  # type: ignore[assignment]
    body = transfer.store.pop("mem://manifest")
    real_get = transfer.get
    tries = []

    def get(url: str, **kw: object) -> bytes | None:
        tries.append(url)
        if len(tries) == 3:
            transfer.store["mem://manifest"] = body
        return real_get(url, **kw)  # type: ignore[arg-type]

    transfer.get = get  # type: ignore[method-assign]
    assert agent.fetch_manifest("mem://manifest").url("status_put") == "mem://status"
    assert len(tries) == 3 and (agent.vm_dir / "manifest").read_bytes() == body


# ---- races: who ends the run ----------------------------------------------------------------------
def test_final_gate_admits_exactly_one_of_many_threads(tmp_path: Path) -> None:
    for i in range(20):
        gate = FinalGate(tmp_path / f"w{i}")
        (tmp_path / f"w{i}").mkdir()
        wins: list[str] = []
        start = threading.Barrier(6)

        def race(who: str, gate: FinalGate = gate, wins: list[str] = wins, start: threading.Barrier = start) -> None:
            start.wait()
            if gate.take(who):
                wins.append(who)

        threads = [threading.Thread(target=race, args=(f"t{n}",)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(wins) == 1


def test_gate_taken_by_another_process_stands_everyone_down(tmp_path: Path) -> None:
    (tmp_path / "final").mkdir()  # the backstop process got there first
    gate = FinalGate(tmp_path)
    assert not gate.take("watchdog") and gate.owner == "elsewhere" and gate.taken()


def test_watchdog_stands_down_when_the_job_ended_first(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, deadline_in=0)
    agent.take_final("main")
    assert agent.end_at_deadline() is False
    assert "mem://status" not in agent.transfer.store  # type: ignore[attr-defined]


def test_main_stands_down_at_the_next_stage_once_the_watchdog_ended_the_run(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, deadline_in=0)
    assert agent.end_at_deadline()
    with pytest.raises(StandDown):
        agent.stage("run")
    with pytest.raises(StandDown):
        agent.run_step("true")


def test_one_final_status_when_main_and_watchdog_end_together(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, clock=Clock(), deadline_in=0)
    results: list[str] = []

    def main_end() -> None:
        try:
            agent.take_final("main")
            agent.finish("succeeded", 0, 0, "", terminate=False)
            results.append("main")
        except StandDown:
            results.append("main stood down")

    t1 = threading.Thread(target=main_end)
    t2 = threading.Thread(target=lambda: results.append(f"watchdog {agent.end_at_deadline()}"))
    t1.start()
    t2.start()
    t1.join()
    t2.join()
    finals = [c for c in agent.transfer.calls if c == ("put", "mem://status")]  # type: ignore[attr-defined]
    assert len(finals) == 1
    assert sorted(results) in (["main", "watchdog False"], ["main stood down", "watchdog True"])


# ---- retries -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fails", "hard", "ok", "sleeps"),
    [
        (0, False, True, []),
        (1, False, False, []),
        (3, True, True, [1, 2, 3]),
        (5, True, False, [1, 2, 3, 4]),
    ],
)
def test_hard_uploads_try_four_more_times(tmp_path: Path, fails: int, hard: bool, ok: bool, sleeps: list[int]) -> None:
    clock = FakeClock()
    transfer = FakeTransfer(sleep=clock.sleep)
    transfer.fail_puts = fails
    part = tmp_path / "p"
    part.write_bytes(b"x")
    assert transfer.put_file("mem://s", part, hard=hard) is ok
    assert clock.sleeps == sleeps


def test_a_failed_final_status_upload_is_logged_and_the_run_still_ends(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.transfer.refuse.add("mem://status")  # type: ignore[attr-defined]
    agent.take_final("main")
    agent.finish("succeeded", 0, 0, "")
    assert agent.codes == [0]  # type: ignore[attr-defined]
    assert "status upload failed" in (agent.vm_dir / "job.log").read_text()
    assert agent.clock.sleeps == [1, 2, 3, 4]  # type: ignore[attr-defined]


# ---- the log pump ---------------------------------------------------------------------------------
def _pump(agent: Agent, upload_style: str = "dir", part_max: int = 16) -> LogPump:
    grant = protocol.LogGrant(style=upload_style, url="mem://log", key_prefix="runs/r/node-0/log/")
    return LogPump(agent.log_path, agent.st, agent.board, log_upload(grant, agent.transfer), part_max)


def test_a_failed_part_is_sent_again_unchanged_even_after_the_log_grew(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.log_path.write_bytes(b"A" * 16 + b"B" * 16)
    pump = _pump(agent)
    assert pump.flush() == SENT
    agent.transfer.fail_puts = 1  # type: ignore[attr-defined]
    assert pump.flush() == FAILED
    with open(agent.log_path, "ab") as f:
        f.write(b"C" * 10)
    assert pump.flush() == SENT
    store = agent.transfer.store  # type: ignore[attr-defined]
    assert store["mem://log/000000"] == b"A" * 16 and store["mem://log/000001"] == b"B" * 16
    assert (agent.board.get("log_parts"), agent.board.get("log_bytes")) == (2, 32)
    assert pump.flush() == SENT and store["mem://log/000002"] == b"C" * 10
    assert pump.flush() == NOTHING


def test_final_drain_sends_everything_in_parts_of_at_most_the_cap(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.log_path.write_bytes(bytes(range(50)))
    pump = _pump(agent)
    assert pump.flush(final=True) == MORE
    pump.drain()
    store = agent.transfer.store  # type: ignore[attr-defined]
    parts = [store[f"mem://log/{i:06d}"] for i in range(4)]
    assert b"".join(parts) == bytes(range(50)) and max(map(len, parts)) <= 16


def test_s3_post_parts_carry_the_key_under_the_prefix(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.log_path.write_bytes(b"hello")
    assert _pump(agent, "post").flush() == SENT
    assert ("post", "runs/r/node-0/log/000000") in agent.transfer.calls  # type: ignore[attr-defined]


def test_append_blob_parts_go_at_their_byte_offsets_and_are_paced(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.log_path.write_bytes(b"x" * 40)
    pump = _pump(agent, "append")
    pump.drain()
    offsets = [o for o, _ in agent.transfer.appended["mem://log"]]  # type: ignore[attr-defined]
    assert offsets == [0, 16, 32]
    now = 1000.0
    assert pump.gap(now, now + 450_000, 1.0) == pytest.approx(450_000 / (protocol.APPEND_PACED_BLOCKS - 3))
    assert _pump(agent, "dir").gap(now, now + 450_000, 1.0) == 1.0


def test_no_grant_means_nothing_to_send(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.log_path.write_bytes(b"data")
    pump = LogPump(agent.log_path, agent.st, agent.board, log_upload(protocol.LogGrant(), agent.transfer), 16)
    assert pump.flush() == NOTHING and pump.flush(final=True) == NOTHING


def test_upload_style_comes_from_the_grant() -> None:
    t = FakeTransfer()
    assert isinstance(log_upload(protocol.LogGrant("dir", "u"), t), DirUpload)
    assert isinstance(log_upload(protocol.LogGrant("post", "u"), t), PostUpload)
    assert isinstance(log_upload(protocol.LogGrant("append", "u"), t), AppendUpload)


# ---- heartbeat -------------------------------------------------------------------------------------
def test_heartbeat_every_interval_and_a_full_disk_named_once_and_in_the_end(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.heartbeat = Heartbeat(agent.board, agent.vm_dir, 5.0, agent.log, free=lambda p: 10)
    hb = agent.heartbeat
    assert hb.step(100.0) and not hb.step(104.0) and hb.step(105.0)
    assert (agent.vm_dir / "job.log").read_text().count("disk is full") == 1
    agent.take_final("main")
    agent.finish("succeeded", 0, 0, "")
    assert "the VM's disk was full" in status(agent)["message"]


# ---- preemption guard and checkpoints ---------------------------------------------------------------
def test_channel_notice_preempts_with_its_reason(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    agent.transfer.store["mem://notice"] = protocol.notice_text()  # type: ignore[attr-defined]
    guard = Guard("mem://notice", agent.transfer, agent.hooks, None, 5.0, 60.0, agent.clock.now())
    with pytest.raises(StandDown):
        guard.step(agent.clock.now(), agent.preempted)
    doc = status(agent)
    assert (doc["state"], doc["message"]) == ("preempted", "preempted: simulated notice (gpucloud preempt)")
    assert (agent.vm_dir / "notice" / "preempted").read_text() == "GPUCLOUD_PREEMPTED=1\n"
    assert agent.codes == [143]  # type: ignore[attr-defined]


def test_guard_polls_the_notice_at_its_interval(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    guard = Guard("mem://notice", agent.transfer, agent.hooks, None, 5.0, 60.0, 0.0)
    for t in (0.0, 1.0, 4.9, 5.0, 9.0, 10.0):
        guard.step(t, lambda why: pytest.fail(why))
    calls = agent.transfer.calls  # type: ignore[attr-defined]
    assert [c for c in calls if c[1] == "mem://notice"] == [("get", "mem://notice")] * 3


def _ckpt(agent: Agent) -> Checkpoints:
    lines = []
    for s in range(2):
        lines += [
            f"ckpt_put {s} mem://slot-{s}",
            f"ckpt_get {s} mem://slot-{s}",
            f"ckpt_sum_put {s} mem://sum-{s}",
            f"ckpt_sum_get {s} mem://sum-{s}",
        ]
    manifest = protocol.parse_manifest("\n".join(lines))
    return Checkpoints(agent.job_dir / "ckpt", agent.vm_dir, agent.st, manifest, agent.transfer, 0, agent.log)


def test_checkpoints_alternate_slots_data_before_record_and_skip_unchanged(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    ck = _ckpt(agent)
    ck.enabled = True
    ck.folder.mkdir(parents=True)
    (ck.folder / "w.bin").write_bytes(b"1")
    assert ck.upload("interval")
    calls = [c for c in agent.transfer.calls if c[0] == "put"]  # type: ignore[attr-defined]
    assert calls == [("put", "mem://slot-0"), ("put", "mem://sum-0")]
    puts = agent.transfer.calls  # type: ignore[attr-defined]
    assert ck.upload("interval") and len([c for c in puts if c[0] == "put"]) == 2
    (ck.folder / "w.bin").write_bytes(b"22")
    assert ck.upload("end")
    store = agent.transfer.store  # type: ignore[attr-defined]
    assert store["mem://sum-0"].startswith(b"1 ") and store["mem://sum-1"].startswith(b"2 ")


def test_restore_takes_the_newest_valid_slot_and_falls_back_past_a_torn_one(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    ck = _ckpt(agent)
    ck.enabled = True
    ck.folder.mkdir(parents=True)
    (ck.folder / "w.bin").write_bytes(b"old")
    ck.upload("interval")
    (ck.folder / "w.bin").write_bytes(b"newer")
    ck.upload("interval")
    store = agent.transfer.store  # type: ignore[attr-defined]
    store["mem://slot-1"] = store["mem://slot-1"][:20]  # the newest upload was cut short
    (ck.folder / "w.bin").unlink()
    assert ck.restore() == 1
    assert (ck.folder / "w.bin").read_bytes() == b"old"
    assert "checkpoint 2 is torn" in agent.log_path.read_text()


def test_restore_skips_an_incomplete_record_and_starts_fresh_without_any(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    ck = _ckpt(agent)
    agent.transfer.store["mem://sum-0"] = b"3 abc 10"  # type: ignore[attr-defined]
    assert ck.restore() is None
    log = agent.log_path.read_text()
    assert "slot 0: incomplete record, skipped" in log and "the job starts fresh" in log


# ---- safe extraction ---------------------------------------------------------------------------------
def _tar(tmp: Path, *members: tarfile.TarInfo, data: bytes = b"x") -> Path:
    path = tmp / "a.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for m in members:
            tar.addfile(m, io.BytesIO(data) if m.isfile() else None)
    return path


def _member(
    name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, link: str = "", size: int = 1
) -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type, m.mode, m.linkname = kind, mode, link
    m.size = size if kind == tarfile.REGTYPE else 0
    return m


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (_member("../evil"), "a path out of the folder"),
        (_member("/etc/evil"), "a path out of the folder"),
        (_member("a/../../evil"), "a path out of the folder"),
        (_member("s", tarfile.SYMTYPE, link="/etc/passwd"), "type l"),
        (_member("h", tarfile.LNKTYPE, link="x"), "type h"),
        (_member("d", tarfile.CHRTYPE), "type c"),
        (_member("f", tarfile.FIFOTYPE), "type p"),
        (_member("suid", mode=0o4755), "setuid"),
    ],
)
def test_unsafe_members_are_refused_before_anything_is_written(
    tmp_path: Path, member: tarfile.TarInfo, why: str
) -> None:
    archive = _tar(tmp_path, _member("ok.txt"), member)
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(Refused, match=why):
        safe_untar(archive, dest)
    assert list(dest.iterdir()) == []


def test_links_inside_are_kept_for_code_only_and_caps_hold(tmp_path: Path) -> None:
    archive = _tar(tmp_path, _member("ok.txt"), _member("l", tarfile.SYMTYPE, link="ok.txt"))
    with pytest.raises(Refused, match="type l"):
        safe_untar(archive, tmp_path / "a")
    (tmp_path / "b").mkdir()
    assert safe_untar(archive, tmp_path / "b", links=True) == 1
    assert os.readlink(tmp_path / "b" / "l") == "ok.txt"
    with pytest.raises(Refused, match="more than 1 members"):
        safe_untar(archive, tmp_path / "c", links=True, max_members=1)
    with pytest.raises(Refused, match="bytes"):
        safe_untar(_tar(tmp_path, _member("big", size=1), data=b"x"), tmp_path / "d", max_bytes=0)
    (tmp_path / "bad.tgz").write_bytes(b"not a tarball")
    with pytest.raises(Refused, match="cannot be read"):
        safe_untar(tmp_path / "bad.tgz", tmp_path / "e")


def test_an_archive_that_expands_too_far_is_refused(tmp_path: Path) -> None:
    """A small archive of zeros (a gzip bomb) is refused past the ratio, before a byte is written."""
    import gzip
    import io

    size = RATIO_FLOOR + 1024**2
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("zeros")
        info.size = size
        tar.addfile(info, io.BytesIO(bytes(size)))
    bomb = tmp_path / "bomb.tgz"
    bomb.write_bytes(gzip.compress(raw.getvalue(), 9))
    assert size / bomb.stat().st_size > 200
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(Refused, match="expands more than 200 times"):
        safe_untar(bomb, dest)
    assert list(dest.iterdir()) == []
    assert safe_untar(bomb, dest, max_ratio=10_000) == 1  # the cap is a setting


# ---- barrier ---------------------------------------------------------------------------------------
def test_barrier_names_the_ranks_that_never_showed_up(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    barrier = Barrier(
        agent.manifest,
        agent.transfer,
        agent.vm_dir,
        0,
        2,
        30,
        agent.clock.now,
        agent.clock.sleep,
        1.0,
        agent.log,
        lambda: False,
    )
    with pytest.raises(StageFailed, match=r"node\(s\) 1 not ready after 30s"):
        barrier.wait("10.0.0.1")
    agent.transfer.store["mem://ready-1"] = b"10.0.0.2\n"  # type: ignore[attr-defined]
    assert barrier.wait("10.0.0.1") == ["10.0.0.1", "10.0.0.2"]


# ---- provider hooks ----------------------------------------------------------------------------------
IMDS = "http://imds"


def test_hooks_are_chosen_by_declared_behaviour_not_by_name() -> None:
    t = FakeTransfer()
    assert type(hooks_for("exit", "", t, {}, print, lambda s: None)) is Hooks
    assert isinstance(hooks_for("shutdown", "aws-imds-spot", t, {}, print, lambda s: None), AwsSpotHooks)
    assert isinstance(hooks_for("azure-delete", "azure-scheduled-events", t, {}, print, lambda s: None), AzureHooks)


def test_aws_spot_notice_and_launch_index_through_imdsv2() -> None:
    t = FakeTransfer()
    hooks = AwsSpotHooks(t, {"GPUCLOUD_IMDS_ENDPOINT": IMDS}, lambda s: None, lambda s: None)
    assert hooks.notice() is None
    t.requests[("PUT", f"{IMDS}/latest/api/token")] = b"tok"
    t.requests[("GET", f"{IMDS}/latest/meta-data/spot/instance-action")] = b'{"action": "terminate"}'
    t.requests[("GET", f"{IMDS}/latest/meta-data/ami-launch-index")] = b"3\n"
    assert hooks.notice() == 'spot interruption notice {"action":"terminate"}'
    assert hooks.launch_index() == 3


def test_azure_self_delete_retries_then_gives_up_and_multi_node_deletes_only_its_vm() -> None:
    clock = FakeClock()
    lines: list[str] = []
    t = FakeTransfer()
    hooks = AzureHooks(
        t, {"GPUCLOUD_IMDS_ENDPOINT": IMDS, "GPUCLOUD_AZURE_ARM_ENDPOINT": "http://arm"}, lines.append, clock.sleep
    )
    t.requests[
        ("GET", f"{IMDS}/metadata/identity/oauth2/token?api-version=2018-02-01&resource=https://management.azure.com/")
    ] = b'{"access_token": "T"}'
    t.requests[("GET", f"{IMDS}/metadata/instance/compute?api-version=2021-02-01")] = (
        b'{"subscriptionId": "S", "resourceGroupName": "G", "resourceId": "/subscriptions/S/vm/V"}'
    )
    assert hooks.delete_self() is False
    assert clock.sleeps == [15.0] * 40 and lines[-1] == "resource group delete failed"
    t.requests[("DELETE", "http://arm/subscriptions/S/vm/V?forceDeletion=true&api-version=2024-07-01")] = b""
    assert hooks.delete_self(lambda: " 1") is True
    assert "node(s) 1 still running: deleting only this VM" in lines[-1]


# ---- signals and stage failures ----------------------------------------------------------------------
def test_signal_stops_the_job_once_uploads_its_artifacts_and_names_its_code(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, clock=Clock(), artifacts=["out"])
    agent.log_path.touch()
    agent.runner.start(
        "mkdir -p out; trap 'echo saved > out/a; exit 7' TERM; while :; do sleep 0.02; done", agent.job_env()
    )
    time.sleep(0.2)
    agent.on_signal()
    doc = status(agent)
    assert (doc["state"], doc["exit_code"]) == ("failed", None)
    assert doc["message"].endswith("the job exited with code 7 after SIGTERM")
    assert doc["artifacts_sha256"] and "mem://art" in agent.transfer.store  # type: ignore[attr-defined]
    assert agent.codes == [143]  # type: ignore[attr-defined]


def test_a_job_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, clock=Clock())
    agent.log_path.touch()
    agent.runner.start("trap '' TERM; while :; do sleep 0.02; done", agent.job_env())
    time.sleep(0.1)
    t = time.monotonic()
    agent.runner.kill(grace=0.5)
    assert time.monotonic() - t < 3
    assert "job ignored SIGTERM for 0 s: SIGKILL" in agent.log_path.read_text()


def test_failing_stage_ends_in_error_with_its_message(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    with pytest.raises(StandDown):
        agent.fail("could not download the code")
    doc = status(agent)
    assert (doc["state"], doc["message"]) == ("error", "could not download the code")
    assert agent.codes == [1]  # type: ignore[attr-defined]


# ---- the wire format -----------------------------------------------------------------------------------
def test_status_document_bytes_are_the_bash_format_and_signatures_split_back() -> None:
    raw = protocol.status_document(
        run_id="r",
        rank=0,
        state="succeeded",
        stage="done",
        stages={"done": {"start": 2, "end": 2, "ok": True}, "run": {"start": 1, "end": 2, "ok": True}},
        heartbeat=3,
        exit_code=0,
        message='a"b\x01\n',
        log_parts=1,
        log_bytes=5,
    )
    assert raw == (
        b'{"run_id":"r","rank":0,"state":"succeeded","stage":"done","stages":{"run":{"start":1,"end":2,"ok":true},'
        b'"done":{"start":2,"end":2,"ok":true}},"heartbeat":3,"exit_code":0,"message":"a\\"b \\n","log_parts":1,'
        b'"log_bytes":5,"artifacts_sha256":""}\n'
    )
    signed = protocol.signed_status(raw, "SIG")
    assert signed.endswith(b',"sig":"SIG"}\n') and protocol.split_signature(signed) == (raw, "SIG")
    # one parser for the signed form, the CLI's check included: anything after the field is no signature
    assert protocol.split_signature(signed.rstrip(b"\n") + b"x\n") is None
    assert protocol.split_signature(signed.replace(b'"SIG"', b'"S"I"G"')) is None


def test_manifest_parse_reads_every_key_the_channel_writes() -> None:
    m = protocol.parse_manifest(
        "deadline 123\ncode_get c\nready_get 1 r1\nlog_post P\nlog_post_key K/\nlog_post_field a b c\n"
        "sign ed25519\nckpt_put 1 x\nmanifest 2 m2\nunknown_key v\n"
    )
    assert (m.deadline, m.url("code_get"), m.ranked_url("ready_get", 1), m.signs) == (123, "c", "r1", True)
    assert (m.log.style, m.log.url, m.log.key_prefix, m.log.fields) == ("post", "P", "K/", [("a", "b c")])
    assert m.ranked_url("ckpt_put", 1) == "x" and m.nodes == {2: "m2"}
    assert protocol.parse_checkpoint_record("2 abc 10 end\n") == protocol.CheckpointRecord(2, "abc", 10)
    assert protocol.parse_checkpoint_record("2 abc 10") is None


def test_a_work_folder_that_cannot_be_made_falls_back_and_is_reported(tmp_path: Path) -> None:
    clock = FakeClock()
    codes: list[int] = []
    agent = Agent(
        JobConfig(run_id="run-1"),
        Path("/dev/null/gpucloud"),
        clock=clock,
        transfer=FakeTransfer(sleep=clock.sleep),
        environ={"PATH": os.environ["PATH"], "TMPDIR": str(tmp_path)},
        exit=codes.append,
    )
    agent.make_dirs()
    assert agent.bad_dir == "/dev/null/gpucloud" and agent.vm_dir.parent == tmp_path and agent.st.is_dir()
    agent.manifest = protocol.parse_manifest("status_put mem://status\n")
    with pytest.raises(StandDown):
        agent.fail(f"preflight: cannot create the work folder {agent.bad_dir} (read-only or full disk?)")
    assert "cannot create the work folder /dev/null/gpucloud" in status(agent)["message"] and codes == [1]


def test_the_backstop_reports_deadline_from_disk_unless_someone_did(tmp_path: Path) -> None:
    from gpucloud.vm.agent.__main__ import BACKSTOP_MESSAGE, backstop

    agent = make_agent(tmp_path)
    (agent.vm_dir / "manifest").write_text(MANIFEST.format(deadline=1))
    agent.board.begin_stage("run")  # what the dead main process left on disk
    fresh = make_agent(tmp_path)  # the backstop process: a new agent over the same folder
    fresh.transfer = agent.transfer
    backstop(fresh)
    doc = status(fresh)
    assert (doc["state"], doc["message"]) == ("deadline", BACKSTOP_MESSAGE)
    assert doc["stages"]["run"]["ok"] is False and fresh.codes == [124]  # type: ignore[attr-defined]
    again = make_agent(tmp_path)  # a second firing finds the run reported: no second status
    again.transfer = FakeTransfer()
    backstop(again)
    assert "mem://status" not in again.transfer.store and again.codes == [124]  # type: ignore[attr-defined]


def test_the_backstop_reports_when_the_process_ending_the_run_died_before_its_report(tmp_path: Path) -> None:
    import subprocess

    from gpucloud.vm.agent.__main__ import BACKSTOP_MESSAGE, backstop

    agent = make_agent(tmp_path)
    (agent.vm_dir / "manifest").write_text(MANIFEST.format(deadline=1))
    agent.board.begin_stage("run")
    dead = subprocess.Popen(["true"])
    dead.wait()
    (agent.vm_dir / "final").mkdir()  # the watchdog process took the end, then was killed
    (agent.vm_dir / "final" / "owner").write_text(f"{dead.pid}\n")
    fresh = make_agent(tmp_path, self_termination="shutdown")  # a cloud: the backstop killed nothing itself
    fresh.transfer = agent.transfer
    fresh.hooks = Hooks(fresh.transfer, {}, fresh.log, fresh.clock.sleep)  # no real shutdown here
    backstop(fresh)
    assert status(fresh)["message"] == BACKSTOP_MESSAGE and (fresh.st / "reported").exists()
    local = make_agent(tmp_path / "local")  # `exit`: the shim's sleeper killed the reporter: no takeover
    (local.vm_dir / "manifest").write_text(MANIFEST.format(deadline=1))
    (local.vm_dir / "final").mkdir()
    (local.vm_dir / "final" / "owner").write_text(f"{dead.pid}\n")
    backstop(local)
    assert "mem://status" not in local.transfer.store  # type: ignore[attr-defined]


def test_a_final_status_that_never_went_up_is_not_marked_reported(tmp_path: Path) -> None:
    """The guest's reboot showed it: a report whose upload failed (the network already down) was
    marked reported, so no later firing reported the run, and its channel said `running` forever."""
    from gpucloud.vm.agent.__main__ import BACKSTOP_MESSAGE, backstop

    agent = make_agent(tmp_path)
    (agent.vm_dir / "manifest").write_text(MANIFEST.format(deadline=1))
    agent.board.begin_stage("run")
    down = make_agent(tmp_path)
    down.transfer = FakeTransfer()
    down.transfer.refuse.add("mem://status")
    backstop(down)
    assert "mem://status" not in down.transfer.store and not (down.st / "reported").exists()
    import subprocess

    dead = subprocess.Popen(["true"])  # the process that took the end is gone (the machine rebooted)
    dead.wait()
    (agent.vm_dir / "final" / "owner").write_text(f"{dead.pid}\n")
    again = make_agent(tmp_path, self_termination="shutdown")  # the next boot's backstop still reports it
    again.transfer = FakeTransfer()
    again.hooks = Hooks(again.transfer, {}, again.log, again.clock.sleep)  # no real shutdown here
    backstop(again)
    assert json.loads(again.transfer.store["mem://status"])["message"] == BACKSTOP_MESSAGE
    assert (again.st / "reported").exists()
