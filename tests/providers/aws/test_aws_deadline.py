"""Layer (c) of the deadline on AWS: an EventBridge Scheduler one-time schedule
per attempt that terminates the attempt's instances after the run's expiry, against moto in
server mode. What it looks like; that teardown, `down` and the end of a run remove it; that a
scheduler that refuses us costs one warning and nothing else; gc of stale schedules; the role's
documents (docs/PROVIDERS.md, "AWS deadline schedule")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpucloud.providers.aws import deadline
from tests.support.aws_faults import ACCOUNT, HOOKS, Fault
from tests.support.aws_requests import make_request  # noqa: F401
from tests.support.aws_runs import invoke, run_id_in, write_aws_job  # noqa: F401
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.moto_server import Moto, moto, moto_server, tagged_alive  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
ROLE = f"arn:aws:iam::{ACCOUNT}:role/gpucloud-deadline"


@pytest.fixture(autouse=True)
def _fresh_warning() -> Iterator[None]:
    deadline.reset()
    yield
    deadline.reset()


def schedules(
    moto: Moto,  # noqa: F811
    run_id: str | None = None,
    region: str = "us-east-1",
) -> dict[str, dict[str, Any]]:
    """gpucloud's schedules of the region (of one run), name -> GetSchedule's answer."""
    sched = moto.client("scheduler", region)
    names = [s["Name"] for s in sched.list_schedules(NamePrefix="gpucloud-")["Schedules"]]
    return {n: sched.get_schedule(Name=n) for n in names if run_id is None or n.startswith(f"gpucloud-{run_id}-")}


def make_schedule(moto: Moto, name: str, when: datetime, region: str = "us-east-1") -> None:  # noqa: F811
    moto.client("scheduler", region).create_schedule(
        Name=name,
        GroupName="default",
        ScheduleExpression=deadline.at_expression(when),
        FlexibleTimeWindow={"Mode": "OFF"},
        Description=f"gpucloud run {name[9:]} attempt 0: test",
        Target={"Arn": deadline.TARGET_ARN, "RoleArn": ROLE, "Input": json.dumps({"InstanceIds": ["i-0"]})},
    )


# ---- the provider ----------------------------------------------------------------------------------------


def test_provision_schedules_terminate_instances_after_the_expiry(moto, provider, journal, hooks):  # noqa: F811
    req = make_request()
    handle = provider.provision(req, journal)
    try:
        name = f"gpucloud-{req.run_id}-0"
        assert handle.resources["schedule"] == [name]
        got = schedules(moto, req.run_id)[name]
        assert got["ScheduleExpression"] == f"at({(req.expires_at + deadline.MARGIN):%Y-%m-%dT%H:%M:%S})"
        assert got["ScheduleExpressionTimezone"] == "UTC" and got["FlexibleTimeWindow"] == {"Mode": "OFF"}
        assert got["ActionAfterCompletion"] == "DELETE" and got["State"] == "ENABLED"
        target = got["Target"]
        assert target["Arn"] == "arn:aws:scheduler:::aws-sdk:ec2:terminateInstances"
        assert target["RoleArn"] == ROLE
        assert json.loads(target["Input"]) == {"InstanceIds": handle.nodes}
        [row] = [r for r in journal.resources(req.run_id) if r.kind == "schedule"]
        assert row.status == "created" and row.name == name and row.cloud_id.endswith(f"schedule/default/{name}")
        # journalled before the call
        ops = [c.operation for c in hooks.calls]
        assert ops.index("RunInstances") < ops.index("CreateSchedule")
    finally:
        provider.teardown(handle, journal)
    assert schedules(moto, req.run_id) == {}
    assert journal.resources(req.run_id) == []


@pytest.mark.parametrize(
    ("setting", "role"),
    [
        ("my-role", f"arn:aws:iam::{ACCOUNT}:role/my-role"),
        ("arn:aws:iam::111122223333:role/x", "arn:aws:iam::111122223333:role/x"),
        ("off", None),
    ],
)
def test_the_role_setting(moto, provider, journal, hooks, monkeypatch, setting, role):  # noqa: F811
    monkeypatch.setenv(deadline.ROLE_ENV, setting)
    req = make_request()
    handle = provider.provision(req, journal)
    try:
        got = schedules(moto, req.run_id)
        if role is None:
            assert got == {} and not hooks.ops("CreateSchedule") and "schedule" not in handle.resources
        else:
            assert [s["Target"]["RoleArn"] for s in got.values()] == [role]
    finally:
        provider.teardown(handle, journal)
    assert journal.resources(req.run_id) == []


@pytest.mark.parametrize("code", ["AccessDeniedException", "ValidationException"])
def test_a_refused_schedule_costs_one_warning_and_leaves_nothing(moto, provider, journal, hooks, code):  # noqa: F811
    warnings: list[str] = []
    provider._warn = warnings.append
    hooks.add(
        Fault(
            "CreateSchedule",
            code,
            times=None,
            message="The execution role you provide must allow AWS EventBridge Scheduler to assume the role.",
        )
    )
    reqs = [make_request(), make_request()]
    handles = [provider.provision(r, journal) for r in reqs]
    assert all(h.nodes and "schedule" not in h.resources for h in handles)
    deadline_warnings = [w for w in warnings if "deadline schedule" in w]
    assert len(deadline_warnings) == 1, warnings  # once per process, not per launch
    assert code in deadline_warnings[0] and "gpucloud iam-policy aws --deadline-role" in deadline_warnings[0]
    for req, handle in zip(reqs, handles, strict=True):
        rows = journal.resources(req.run_id, alive_only=False)
        assert [r.status for r in rows if r.kind == "schedule"] == ["deleted"]
        provider.teardown(handle, journal)
        assert tagged_alive(moto, req.run_id) == [] and journal.resources(req.run_id) == []
    assert not hooks.ops("DeleteSchedule")


def test_the_schedule_stays_while_an_instance_could_not_be_terminated(moto, provider, journal, hooks):  # noqa: F811
    from gpucloud.providers.aws.errors import AwsTeardownError

    req = make_request()
    handle = provider.provision(req, journal)
    hooks.add(Fault("TerminateInstances", "InternalError", times=None))
    with pytest.raises(AwsTeardownError):
        provider.teardown(handle, journal)
    assert list(schedules(moto, req.run_id)) == [f"gpucloud-{req.run_id}-0"], "the backstop stays"
    hooks.faults.clear()
    provider.teardown(handle, journal)
    assert schedules(moto, req.run_id) == {} and journal.resources(req.run_id) == []


def test_a_schedule_that_cannot_be_deleted_does_not_fail_teardown(moto, provider, journal, hooks):  # noqa: F811
    req = make_request()
    handle = provider.provision(req, journal)
    hooks.add(Fault("DeleteSchedule", "AccessDeniedException", times=None))
    provider.teardown(handle, journal)  # no error: it fires on terminated instances, gc removes it
    assert tagged_alive(moto, req.run_id) == [] and journal.resources(req.run_id) == []
    hooks.faults.clear()
    deadline.delete_schedule(provider, "us-east-1", f"gpucloud-{req.run_id}-0")


def test_partial_teardown_finds_the_schedule_in_the_journal(moto, provider, journal, hooks):  # noqa: F811
    from gpucloud.contract.provider import RunHandle

    req = make_request()
    provider.provision(req, journal)  # the CLI died before it stored the handle
    partial = RunHandle(req.run_id, "aws", "us-east-1", attempt=0, complete=False)
    provider.teardown(partial, journal)
    assert schedules(moto, req.run_id) == {} and tagged_alive(moto, req.run_id) == []
    assert journal.resources(req.run_id) == []


def test_gc_removes_stale_schedules_and_keeps_future_ones(moto, provider, hooks):  # noqa: F811
    now = datetime.now(UTC)
    make_schedule(moto, "gpucloud-stale-run-0", now - timedelta(hours=2), region="eu-west-1")
    make_schedule(moto, "gpucloud-future-run-0", now + timedelta(hours=2))
    make_schedule(moto, "gpucloud-recent-run-0", now - timedelta(minutes=10))  # may still be firing
    try:
        dry = provider.gc(now, dry_run=True)
        assert any("would delete deadline schedule gpucloud-stale-run-0 (run stale-run" in line for line in dry), dry
        assert "gpucloud-stale-run-0" in schedules(moto, region="eu-west-1")
        lines = provider.gc(now, dry_run=False)
        assert any("deleted deadline schedule gpucloud-stale-run-0" in line for line in lines), lines
        # The moto server is shared with other tests (their runs' live schedules may be there): look at ours.
        assert "gpucloud-stale-run-0" not in schedules(moto, region="eu-west-1")
        assert {"gpucloud-future-run-0", "gpucloud-recent-run-0"} <= set(schedules(moto))
    finally:
        for name in ("gpucloud-future-run-0", "gpucloud-recent-run-0"):
            deadline.delete_schedule(provider, "us-east-1", name)


def test_gc_goes_on_when_the_scheduler_refuses(moto, provider, hooks):  # noqa: F811
    from gpucloud.contract.provider import expiry_tag

    tags = [
        {"Key": "gpucloud-run", "Value": "gc-denied"},
        {"Key": "gpucloud-expires", "Value": expiry_tag(datetime.now(UTC) - timedelta(minutes=5))},
    ]
    vol = moto.client("ec2").create_volume(
        AvailabilityZone="us-east-1a", Size=8, TagSpecifications=[{"ResourceType": "volume", "Tags": tags}]
    )["VolumeId"]
    hooks.add(Fault("ListSchedules", "AccessDeniedException", times=None))
    lines = provider.gc(datetime.now(UTC), dry_run=False)
    assert f"aws/us-east-1: deleted volume {vol} (run gc-denied, expired {tags[1]['Value']})" in lines
    skipped = [line for line in lines if deadline.SKIPPED in line]
    assert len(skipped) == 1 and "AccessDeniedException" in skipped[0], lines
    assert tagged_alive(moto, "gc-denied") == []


def test_schedule_names_fit_and_stay_the_same() -> None:
    assert deadline.schedule_name("train-20261203-101010-abcd", 2) == "gpucloud-train-20261203-101010-abcd-2"
    long_a, long_b = "a" * 70 + "-1", "a" * 70 + "-2"
    names = {deadline.schedule_name(r, 0) for r in (long_a, long_b)}
    assert len(names) == 2 and all(len(n) <= deadline.MAX_NAME for n in names)
    assert deadline.schedule_name(long_a, 0) == deadline.schedule_name(long_a, 0)
    assert deadline.parse_at("at(2026-12-03T10:00:00)") == datetime(2026, 12, 3, 10, tzinfo=UTC)
    assert deadline.parse_at("rate(5 minutes)") is None


# ---- through the CLI -------------------------------------------------------------------------------------


def test_a_run_removes_its_schedule_and_down_removes_a_detached_ones(
    inproc: None,
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,
    tmp_path: Path,
) -> None:  # noqa: F811
    job = write_aws_job(tmp_path / "job.yaml", run="echo deadline-layer", name="dl")
    code, out = invoke("run", str(job), "--cloud", "aws")
    assert code == 0, out[-2000:]
    run_id = run_id_in(out)
    assert HOOKS.ops("CreateSchedule") and schedules(moto, run_id) == {}
    code, out = invoke(
        "run", str(write_aws_job(tmp_path / "long.yaml", run="sleep 60", name="dl2")), "--cloud", "aws", "--detach"
    )
    assert code == 0, out[-2000:]
    run_id = run_id_in(out)
    [got] = schedules(moto, run_id).values()
    assert json.loads(got["Target"]["Input"])["InstanceIds"][0].startswith("i-")
    code, out = invoke("down", run_id, "--yes")
    assert code == 0, out[-2000:]
    assert schedules(moto, run_id) == {} and tagged_alive(moto, run_id) == []


def test_a_run_with_the_scheduler_denied_succeeds_with_one_warning(
    inproc: None,
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,
    tmp_path: Path,
) -> None:  # noqa: F811
    HOOKS.add(Fault("CreateSchedule", "AccessDeniedException", times=None))
    job = write_aws_job(tmp_path / "job.yaml", run="echo still-runs", name="dl3")
    code, out = invoke("run", str(job), "--cloud", "aws")
    assert code == 0, out[-2000:]
    assert "still-runs" in out and out.count("did not create the deadline schedule") == 1
    assert tagged_alive(moto, run_id_in(out)) == [] and schedules(moto, run_id_in(out)) == {}


def test_iam_policy_prints_the_deadline_role() -> None:
    code, out = invoke("iam-policy", "aws", "--deadline-role", "--account", ACCOUNT)
    assert code == 0, out
    doc = json.loads(out)
    assert doc["RoleName"] == "gpucloud-deadline"
    [trust] = doc["TrustPolicy"]["Statement"]
    assert trust["Principal"] == {"Service": "scheduler.amazonaws.com"} and trust["Action"] == "sts:AssumeRole"
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": ACCOUNT}}
    [perm] = doc["PermissionPolicy"]["Statement"]
    assert perm["Action"] == "ec2:TerminateInstances"
    assert perm["Condition"] == {"Null": {"aws:ResourceTag/gpucloud-run": "false"}}
    code, out = invoke("iam-policy", "aws", "--deadline-role", "--part", "trust", "--account", ACCOUNT)
    assert code == 0 and json.loads(out) == doc["TrustPolicy"]
    code, out = invoke("iam-policy", "aws", "--deadline-role", "--part", "nope", "--account", ACCOUNT)
    assert code == 2 and "--part takes" in out and "Traceback" not in out


def test_iam_policy_finds_the_account_itself(moto: Moto) -> None:  # noqa: F811
    from gpucloud.providers.aws import reset_shared

    reset_shared()
    code, out = invoke("iam-policy", "aws", "--deadline-role", "--part", "permissions")
    assert code == 0, out
    assert json.loads(out)["Statement"][0]["Resource"] == f"arn:aws:ec2:*:{ACCOUNT}:instance/*"
