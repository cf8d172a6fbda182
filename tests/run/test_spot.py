"""Spot runs that finish (docs/SPOT.md): the guard's interruption notices (AWS IMDSv2, Azure
Scheduled Events, the channel's simulated notice), checkpoints that survive a preemption during
their own upload, recovery through the real CLI on the local provider (followed, and detached +
`gpucloud watch`), the restart budget and on-demand fallback, and `gpucloud cost`.

The AWS and Azure simulator runs live in tests/run/test_spot_clouds.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from gpucloud.state.runs_db import Store
from tests.support.cli import cli, start_cli
from tests.support.fake_imds import FakeImds, imds  # noqa: F401  (fixture)
from tests.support.local_runs import leftovers
from tests.support.polling import wait_until
from tests.support.spot_job import (
    check_finished_count,
    latest_run,
    preempt_when_resumed,
    preempted_twice,
    resumed_at,
    run_log,
    write_count_job,
)
from tests.support.text import flat
from tests.support.vm_boot import make_vm

REPO = Path(__file__).resolve().parents[2]


# ---- the guard on the VM ---------------------------------------------------------------------------


# The job saves its state on SIGTERM, as a real one would, and says what the preempted file holds.
TRAP_JOB = (
    'trap \'echo saved > ckpt/state; echo "file: $(cat "$GPUCLOUD_PREEMPTED_FILE")"; exit 143\' TERM; '
    "echo started; echo running > ckpt/state; while :; do sleep 0.1; done"
)


@pytest.mark.parametrize("provider", ["aws", "azure"])
def test_cloud_notice_stops_the_job_uploads_its_checkpoint_and_reports_preempted(
    tmp_path: Path, imds: type[FakeImds], provider: str
) -> None:
    """AWS IMDSv2 spot/instance-action, Azure Scheduled Events `Preempt`: SIGTERM to the job, the
    preempted file, the checkpoint the job saved on SIGTERM uploaded, status `preempted`."""
    url = imds.url  # type: ignore[attr-defined]
    vm = make_vm(
        tmp_path,
        provider=provider,
        gpu="K80",
        run=TRAP_JOB,
        spot={"checkpoint": "ckpt", "checkpoint_interval": 600},
        stub_env={
            "STUB_GPU_NAME": "Tesla K80",
            "STUB_DRIVER": "470.82.01",
            "GPUCLOUD_IMDS_ENDPOINT": url,
            "GPUCLOUD_AZURE_ARM_ENDPOINT": url,
        },
    ).start()
    assert wait_until(lambda: "started" in vm.log(), 30), vm.log()
    assert (vm.status()["state"], vm.status()["stage"]) == ("running", "run")
    imds.preempted = True
    vm.wait(60)
    status = vm.status()
    assert status["state"] == "preempted", status
    assert status["exit_code"] is None and status["message"].startswith("preempted: ")
    assert ("spot interruption notice" if provider == "aws" else "Scheduled Events: Preempt") in status["message"]
    log = vm.log()
    assert "file: GPUCLOUD_PREEMPTED=1" in log and "checkpoint 1 uploaded (notice" in log, log
    record = (vm.channel.root / "runs" / vm.run_id / "checkpoint" / "slot-0.sum").read_text().split()
    assert record[0] == "1" and record[-1] == "end"
    assert vm.rc == 143


def test_a_checkpoint_torn_by_the_end_of_the_machine_is_never_restored(tmp_path: Path) -> None:
    """Uploads v1 (slot 0), v2 (slot 1); the machine dies half-way through v3's upload (slot 0):
    the next attempt restores v2, the previous complete one. A slot whose data does not match its
    record is skipped too (`torn`), never unpacked."""
    run_id = f"r{uuid.uuid4().hex[:8]}"
    channel_run = tmp_path / "channel" / "runs" / run_id
    wrapper = tmp_path / "bin" / "curl"
    wrapper.parent.mkdir(parents=True)
    # Test double of the machine's end during an upload: the 3rd checkpoint data PUT writes half
    # the bytes, then the whole bootstrap process group is killed (SIGKILL: nothing runs after it).
    wrapper.write_text(f'''#!/bin/bash
args=("$@") src="" url="${{!#}}"
for ((i = 0; i < $#; i++)); do [[ ${{args[i]}} == -T ]] && src=${{args[i + 1]}}; done
if [[ -n $src && $url == *checkpoint/slot-*.tar.gz ]]; then
  n=$(($(cat "{tmp_path}/puts" 2>/dev/null || echo 0) + 1)); echo "$n" >"{tmp_path}/puts"
  if ((n == ${{TORN_AT:-0}})); then
    head -c $(($(stat -c %s "$src") / 2)) "$src" >"${{url#file://}}"
    kill -KILL 0
  fi
fi
exec {subprocess.check_output(["bash", "-c", "command -v curl"], text=True).strip()} "$@"
''')
    wrapper.chmod(0o755)
    wait = 'wait_for() { until grep -qs "^$2 " "$CH/checkpoint/slot-$1.sum"; do sleep 0.05; done; }; '
    job = (
        'if [ -f ckpt/state ]; then echo "restored $(cat ckpt/state) $(ls ckpt | tr "\\n" " ")"; exit 0; fi; '
        + wait
        + "echo v1 > ckpt/state; wait_for 0 1; echo v2 > ckpt/state; wait_for 1 2; "
        "head -c 400000 /dev/urandom > ckpt/blob; echo v3 > ckpt/state; sleep 60"
    )
    spot = {"checkpoint": "ckpt", "checkpoint_interval": 1}

    def boot(torn_at: int = 0) -> object:
        vm = make_vm(tmp_path, run=job, env={"CH": str(channel_run)}, spot=spot, run_id=run_id)
        vm.env.update(PATH=f"{wrapper.parent}:{vm.env['PATH']}", TORN_AT=str(torn_at))
        return vm

    first = boot(torn_at=3).run(60)
    pgid = (first.vm_dir / "job.pgid").read_text().strip()
    os.killpg(int(pgid), signal.SIGKILL)  # the job's own session died with the machine
    assert first.rc == -signal.SIGKILL, first.stderr
    torn, complete = channel_run / "checkpoint" / "slot-0.tar.gz", channel_run / "checkpoint" / "slot-1.tar.gz"
    assert (channel_run / "checkpoint" / "slot-0.sum").read_text().split()[0] == "1"  # v3's record never written
    assert torn.stat().st_size > complete.stat().st_size  # half of v1 + 400 kB of noise

    second = boot().run(60)
    assert second.status()["state"] == "succeeded", second.log()
    assert "restored v2 state" in second.job_output(), second.log()
    assert "checkpoint 2 restored" in second.log()

    # A record that claims the newest checkpoint but does not match its data: skipped as torn.
    (channel_run / "checkpoint" / "slot-0.sum").write_text(f"9 {'0' * 64} 123 end\n")
    third = boot().run(60)
    assert "checkpoint 9 is torn" in third.log() and "restored v2 state" in third.job_output(), third.log()


# ---- recovery through the CLI on the local provider ------------------------------------------------------


def test_local_run_preempted_twice_resumes_and_finishes(tmp_path: Path, gpucloud_home: Path) -> None:
    n = 150  # 15 s of counting: room for two notices and their relaunches on a loaded machine
    job = write_count_job(tmp_path / "job", n=n, cloud="local")
    run_id, proc = preempted_twice(["gpucloud", "run", str(job)], gpucloud_home, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "restart 2 of 2 after preempted" in proc.stderr
    said = flat(proc.stderr)  # a preemption is no failure of the job, and what comes next is said
    assert "run FAILED" not in said and "run preempted in" in said and "relaunching, up to" in said, said
    check_finished_count(gpucloud_home, run_id, tmp_path, n)
    assert Store(gpucloud_home / "state.db").get_run(run_id).status == "succeeded"
    assert not leftovers(gpucloud_home, run_id)


def test_detached_run_recovered_by_watch(tmp_path: Path, gpucloud_home: Path) -> None:
    """`run --detach` + `gpucloud watch RUN` (another process) does what a following `run` does."""
    n = 150
    job = write_count_job(tmp_path / "job", n=n, cloud="local")
    started = cli("run", str(job), "--detach", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    assert "gpucloud watch" in flat(started.stderr)  # says that nothing recovers it otherwise
    run_id = started.stdout.strip()
    _, watcher = preempted_twice(["gpucloud", "watch", run_id, "--json"], gpucloud_home, tmp_path, run_id=run_id)
    assert watcher.returncode == 0, watcher.stderr
    assert json.loads(watcher.stdout)["status"] == "succeeded"
    check_finished_count(gpucloud_home, run_id, tmp_path, n)
    assert not leftovers(gpucloud_home, run_id)


def test_preempted_run_without_recovery_ends_preempted(tmp_path: Path, gpucloud_home: Path) -> None:
    job = write_count_job(tmp_path / "job", n=400, cloud="local", extra={"recovery": None})
    proc = start_cli("run", str(job), cwd=tmp_path)
    assert wait_until(lambda: latest_run(gpucloud_home), 30)
    run_id = latest_run(gpucloud_home) or ""
    preempt_when_resumed(gpucloud_home, run_id, tmp_path, 1)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err
    assert "run FAILED" not in flat(err) and "the run ends preempted: `recovery:`" in flat(err), err
    run = Store(gpucloud_home / "state.db").get_run(run_id)
    assert run.status == "preempted" and len(run.attempts) == 1 and run.attempts[0].end_reason.startswith("preempted")
    assert not leftovers(gpucloud_home, run_id)
    again = cli("preempt", run_id, "--node", "0", cwd=tmp_path)
    assert again.returncode == 2 and "already ended (preempted)" in again.stderr


# ---- the job file, the restart budget, the cost report ----------------------------------------------------


@pytest.mark.parametrize(
    "line,message",
    [
        ("checkpoint: /data/ckpt", "checkpoint: '/data/ckpt' is an absolute path"),
        ("checkpoint: ../ckpt", "checkpoint: '../ckpt' leaves the working folder"),
        ("checkpoint_interval: soon", "checkpoint_interval: 'soon' is not a duration"),
        ("recovery: {on: [preemption, eviction]}", "recovery.on: 'eviction' is not an event to recover from"),
        ("recovery: {max_restarts: -1}", "recovery.max_restarts"),
        ("recovery: {fallback: spot}", "recovery.fallback: 'spot' is not a fallback. Expected on-demand or none"),
        ("recovery: {retries: 3}", "recovery.retries"),
    ],
)
def test_spot_fields_name_line_field_and_fix(line: str, message: str) -> None:
    from gpucloud.spec.load import SpecError, parse_spec

    with pytest.raises(SpecError) as err:
        parse_spec(f"name: j\nresources: {{cloud: local}}\nrun: echo\n{line}\n", "job.yaml")
    assert str(err.value).startswith("job.yaml:4: ") and message in str(err.value), str(err.value)


def test_spot_fields_defaults() -> None:
    from gpucloud.spec.load import parse_spec

    spec = parse_spec("name: j\nresources: {cloud: local}\nrun: echo\ncheckpoint: out/ckpt/\nrecovery: {}\n", "j.yaml")
    assert (spec.checkpoint, spec.checkpoint_interval) == ("out/ckpt", 600)
    assert spec.recovery is not None and (spec.recovery.on, spec.recovery.max_restarts, spec.recovery.fallback) == (
        ["preemption"],
        3,
        "none",
    )


def _recovery(policy: dict | None, spot: bool = True):  # noqa: ANN202 - test helper
    from types import SimpleNamespace

    from gpucloud.run.recovery import Recovery
    from gpucloud.spec.load import parse_spec

    doc = "name: j\nresources: {cloud: local}\nrun: echo\n" + (f"recovery: {json.dumps(policy)}\n" if policy else "")
    progress = SimpleNamespace(warn=lambda *_: None, info=lambda *_: None)
    rec = Recovery(parse_spec(doc, "j.yaml"), None, "r", None, None, progress)  # type: ignore[arg-type]
    return rec, SimpleNamespace(candidate=SimpleNamespace(spot=spot))


def test_restart_budget_and_on_demand_fallback() -> None:
    rec, launch = _recovery({"on": ["preemption"], "max_restarts": 2, "fallback": "on-demand"})
    assert rec.next_market("preempted", launch) == "same"
    rec.restarts += 1
    assert rec.next_market("preempted", launch) == "on-demand"  # the max_restarts-th preemption
    assert rec.next_market("lost", launch) is None  # not in `on`
    rec, launch = _recovery({"on": ["preemption", "lost"], "max_restarts": 1})
    assert rec.next_market("lost", launch) == "same"
    rec.restarts += 1
    assert rec.next_market("preempted", launch) is None  # budget spent, no fallback
    rec, launch = _recovery({"max_restarts": 0, "fallback": "on-demand"})
    assert rec.next_market("preempted", launch) == "on-demand"  # straight to on-demand
    rec, launch = _recovery(None)
    assert rec.next_market("preempted", launch) is None  # no recovery asked for


def test_cost_report_per_attempt_with_saving_and_zero_for_never_launched(gpucloud_home: Path) -> None:
    from gpucloud.catalog import load_catalog
    from gpucloud.run.cost import cost_report

    off = next(o for o in load_catalog().offerings if o.cloud == "aws" and o.spot_price_per_hour)
    store = Store()
    store.create_run(
        "never",
        name="never",
        spec_path=None,
        spec={},
        cloud="aws",
        region=off.region,
        instance_type=off.instance_type,
        num_nodes=1,
        price_per_hour=off.price_per_hour,
        detached=False,
        pid=None,
    )
    store.start_attempt(
        "never",
        0,
        cloud="aws",
        region=off.region,
        instance_type=off.instance_type,
        spot=True,
        price_per_hour=off.spot_price_per_hour,
        num_nodes=1,
    )
    store.end_attempt("never", 0, "capacity: no spot capacity")
    store.finish_run("never", "no-capacity", exit_code=75)
    store.create_run(
        "spot",
        name="spot",
        spec_path=None,
        spec={},
        cloud="aws",
        region=off.region,
        instance_type=off.instance_type,
        num_nodes=2,
        price_per_hour=off.price_per_hour,
        detached=False,
        pid=None,
    )
    for idx, (spot, price) in enumerate([(True, off.spot_price_per_hour), (False, off.price_per_hour)]):
        store.start_attempt(
            "spot",
            idx,
            cloud="aws",
            region=off.region,
            instance_type=off.instance_type,
            spot=spot,
            price_per_hour=price,
            num_nodes=2,
        )
        store.set_attempt_handle("spot", idx, "{}")
        store.end_attempt("spot", idx, "preempted: notice" if idx == 0 else "teardown")
    with store._tx() as c:  # one hour each, for round numbers
        c.execute("UPDATE attempts SET started_at = 1000, ended_at = 4600 WHERE run_id = 'spot'")
    report = cost_report()
    by_id = {r["run_id"]: r for r in report["runs"]}
    assert by_id["never"]["cost"] == 0 and by_id["never"]["attempts"][0]["billed_seconds"] == 0
    spot_att, od_att = by_id["spot"]["attempts"]
    assert spot_att["market"] == "spot" and spot_att["nodes"] == [
        {"rank": 0, "billed_seconds": 3600.0},
        {"rank": 1, "billed_seconds": 3600.0},
    ]
    assert spot_att["cost"] == pytest.approx(2 * off.spot_price_per_hour)
    assert spot_att["on_demand_cost"] == pytest.approx(2 * off.price_per_hour)
    assert od_att["saving"] == 0 and od_att["on_demand_price_per_hour"] == off.price_per_hour
    assert by_id["spot"]["saving"] == pytest.approx(2 * (off.price_per_hour - off.spot_price_per_hour), abs=1e-5)
    assert report["total"]["cost"] == pytest.approx(by_id["spot"]["cost"])
    assert cost_report("spot")["total"]["runs"] == 1 and cost_report(since="2999-01-01")["runs"] == []


def test_cost_since_that_is_not_a_date_is_a_user_error(tmp_path: Path, gpucloud_home: Path) -> None:
    proc = cli("cost", "--since", "last tuesday", cwd=tmp_path)
    assert proc.returncode == 2 and "--since 'last tuesday' is not a date" in proc.stderr
    proc = cli("cost", cwd=tmp_path)
    assert proc.returncode == 0 and "total: 0 run(s), $0.0000" in proc.stdout


def test_local_machine_lost_without_notice_is_relaunched(tmp_path: Path, gpucloud_home: Path) -> None:
    """`on: [lost]`: a machine that vanishes without a word (no notice, no final status) is found
    lost by the CLI and relaunched; the new attempt resumes from the last interval checkpoint."""
    from gpucloud.providers.local import engine as vm_engine

    job = write_count_job(
        tmp_path / "job", n=60, cloud="local", extra={"recovery": {"on": ["lost"], "max_restarts": 1}}
    )
    proc = start_cli("run", str(job), cwd=tmp_path)
    try:
        assert wait_until(lambda: latest_run(gpucloud_home), 30)
        run_id = latest_run(gpucloud_home) or ""
        assert wait_until(lambda: "(interval" in run_log(gpucloud_home, run_id), 60), run_log(gpucloud_home, run_id)
        vm = vm_engine.BootedVm.load(gpucloud_home / "local" / run_id / "node-0")
        assert vm is not None
        vm.kill(grace=0)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    starts = resumed_at(run_log(gpucloud_home, run_id))
    assert len(starts) == 2 and starts[0] == 0 < starts[1], starts
    run = Store(gpucloud_home / "state.db").get_run(run_id)
    assert [a.end_reason.split(":")[0] for a in run.attempts] == ["lost", "teardown"]
    assert (tmp_path / "gpucloud-runs" / run_id / "result.txt").read_text() == "60"


def test_no_capacity_for_a_relaunch_tries_the_order_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """`on: [capacity]`: a relaunch that finds no capacity anywhere pauses and tries again, as a restart."""
    from types import SimpleNamespace

    from gpucloud.errors import NoCandidateError
    from gpucloud.run import failover, recovery

    calls = []

    def run(self: object, tarball: object) -> str:
        calls.append(tarball)
        if len(calls) == 1:
            raise NoCandidateError("no candidate could be provisioned", [])
        return "launched"

    monkeypatch.setattr(failover.Failover, "run", run)
    monkeypatch.setattr(recovery, "CAPACITY_PAUSE_S", 0.0)
    rec, _ = _recovery({"on": ["preemption", "capacity"], "max_restarts": 2})
    launch = SimpleNamespace(channel=None, candidate=SimpleNamespace(cloud="local", region="local", spot=False))
    outcome = rec._provision(None, [0], launch)  # type: ignore[arg-type]
    assert outcome == "launched" and rec.restarts == 1 and len(calls) == 2
    rec, _ = _recovery({"on": ["preemption"], "max_restarts": 2})
    calls.clear()
    with pytest.raises(NoCandidateError):
        rec._provision(None, [0], launch)  # type: ignore[arg-type]


def test_detached_run_without_a_watcher_is_not_recovered(tmp_path: Path, gpucloud_home: Path) -> None:
    """What the README says: nobody follows it, so a preemption ends it (status preempted, exit 75)."""
    job = write_count_job(tmp_path / "job", n=600, cloud="local")
    started = cli("run", str(job), "--detach", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    assert wait_until(lambda: "(interval" in cli("logs", run_id, cwd=tmp_path).stdout, 60)
    assert cli("preempt", run_id, cwd=tmp_path).returncode == 0
    store = Store(gpucloud_home / "state.db")

    def ended() -> bool:
        cli("status", run_id, cwd=tmp_path)  # brings a detached run's record up to date
        return store.get_run(run_id).final

    assert wait_until(ended, 60)
    run = store.get_run(run_id)
    assert (run.status, run.exit_code, len(run.attempts)) == ("preempted", 75, 1)
    assert run.attempts[0].end_reason.startswith("preempted: simulated notice")
    assert not leftovers(gpucloud_home, run_id)
