"""Layer (c) of the deadline on AWS: an EventBridge Scheduler one-time schedule per attempt that
calls TerminateInstances on the attempt's instances after the run's expiry (docs/INTERNALS.md,
"Never leak, never lose"; docs/PROVIDERS.md, "AWS deadline schedule").

The VM's own backstop and watchdog run on the VM; this one runs in AWS, so it still ends the bill
when the VM hangs before its timers are armed, its clock is wrong, or its OS never comes up. It is
best effort: without the execution role (or the scheduler permissions) the run goes on with one
warning per process, and `gpucloud gc` by the expiry tag stays the last line. The schedule is
journalled before it is created and listed in the RunHandle (kind "schedule"), so teardown and a
partial teardown delete it; `ActionAfterCompletion=DELETE` makes AWS delete one that fired, and gc
deletes any left more than STALE_AFTER past its time. boto3 is imported lazily.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpucloud.contract.provider import TAG_EXPIRES, TAG_RUN, LaunchRequest, RunHandle, expiry_tag
from gpucloud.providers.aws.errors import describe, error_code
from gpucloud.providers.aws.session import AwsClients

if TYPE_CHECKING:
    from gpucloud.contract.provider import Journal

CLOUD = "aws"
SCHEDULE = "schedule"  # the RunHandle / journal kind
ROLE_ENV = "GPUCLOUD_AWS_DEADLINE_ROLE"  # role name or ARN; "off" turns the layer off
DEFAULT_ROLE = "gpucloud-deadline"
GROUP = "default"
PREFIX = "gpucloud-"
MAX_NAME = 64  # CreateSchedule's limit on Name
# The universal target of EC2's TerminateInstances (arn:aws:scheduler:::aws-sdk:<service>:<apiAction>).
TARGET_ARN = "arn:aws:scheduler:::aws-sdk:ec2:terminateInstances"
# After the run's expiry (= deadline + the lifecycle's teardown margin, the expiry tag's value):
# the VM's backstop fires at boot + max_duration + at most 300 s of grace and the CLI's teardown
# follows, so a quarter of an hour more never races a run that ends by itself, and still ends the
# bill long before a periodic gc would. It also covers the scheduler's 60 s precision.
MARGIN = timedelta(minutes=15)
# A one-time schedule deletes itself after it fired; one still there an hour after its time failed
# (role gone, instances already gone): gc removes it.
STALE_AFTER = timedelta(hours=1)
SKIPPED = "deadline schedules not swept"  # gc's note when the scheduler refuses us
FIX = (
    f"Create the role: `gpucloud iam-policy aws --deadline-role` prints its policies and "
    f'docs/PROVIDERS.md ("AWS deadline schedule") the aws cli commands; or set {ROLE_ENV}=off.'
)

_WARNED: set[str] = set()  # one warning per process


def reset() -> None:
    """Forget that this process warned already (tests)."""
    _WARNED.clear()


def schedule_name(run_id: str, attempt: int) -> str:
    """`gpucloud-<run_id>-<attempt>`; past MAX_NAME, the run id is cut and a digest of it keeps
    the name unique and the same on every call."""
    name = f"{PREFIX}{run_id}-{attempt}"
    if len(name) <= MAX_NAME and re.fullmatch(r"[0-9A-Za-z_.-]+", name):
        return name
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:10]
    keep = MAX_NAME - len(PREFIX) - len(digest) - len(str(attempt)) - 2
    head = re.sub(r"[^0-9A-Za-z_.-]", "-", run_id)[:keep]
    return f"{PREFIX}{head}-{digest}-{attempt}"


def at_expression(when: datetime) -> str:
    """`at(YYYY-MM-DDThh:mm:ss)` in UTC (the schedule's time zone is UTC by default)."""
    when = when if when.tzinfo else when.replace(tzinfo=UTC)
    return f"at({when.astimezone(UTC):%Y-%m-%dT%H:%M:%S})"


def parse_at(expression: str, zone: str | None = None) -> datetime | None:
    """The time of an `at(...)` expression (UTC, or `zone` when AWS says so); None otherwise."""
    m = re.fullmatch(r"at\((\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\)", expression or "")
    if not m:
        return None
    when = datetime.fromisoformat(m.group(1))
    if zone and zone != "UTC":
        try:
            from zoneinfo import ZoneInfo

            return when.replace(tzinfo=ZoneInfo(zone)).astimezone(UTC)
        except Exception:  # noqa: BLE001 - an unknown zone: read it as UTC
            pass
    return when.replace(tzinfo=UTC)


def role_setting() -> str | None:
    """The role from ROLE_ENV (name or ARN), the default name, or None when the layer is off."""
    value = os.environ.get(ROLE_ENV, "").strip()
    if value.lower() in ("off", "none", "false", "0"):
        return None
    return value or DEFAULT_ROLE


def role_arn(role: str, account: Callable[[], str]) -> str:
    """The execution role's ARN: `role` itself when it is one, else the account's role of that name."""
    if role.startswith("arn:"):
        return role
    return f"arn:aws:iam::{account()}:role/{role.strip('/')}"


def call(aws: AwsClients, op: str, region: str, **kwargs: Any) -> Any:
    """A scheduler call through the shared client (same timeouts, retries and endpoint settings)."""
    return aws.call(aws.client("scheduler", region), op, **kwargs)


def arm(
    aws: AwsClients,
    req: LaunchRequest,
    journal: Journal,
    handle: RunHandle,
    expires: datetime,
    account: Callable[[], str],
    warn: Callable[[str], None],
) -> str | None:
    """Create the attempt's schedule for the instances of `handle`; its name, or None when the
    layer is off or AWS refused (one warning per process). Never raises: a launch never fails here."""
    role = role_setting()
    if role is None or not handle.nodes:
        return None
    name = schedule_name(req.run_id, req.attempt)
    res = None
    try:
        target = {
            "Arn": TARGET_ARN,
            "RoleArn": role_arn(role, account),
            "Input": json.dumps({"InstanceIds": list(handle.nodes)}),
        }
        res = journal.intent(req.run_id, SCHEDULE, name, handle.region, CLOUD)
        arn = _create(
            aws,
            handle.region,
            name,
            target,
            expires + MARGIN,
            f"gpucloud run {req.run_id} attempt {req.attempt}: terminate its instances after "
            f"the run's expiry {expiry_tag(expires)}",
        )
    except Exception as exc:  # noqa: BLE001 - best effort by design (module doc)
        if res is not None:
            journal.deleted(res)
        _warn_once(warn, journal, req.run_id, exc)
        return None
    handle.add(SCHEDULE, name)
    journal.created(res, arn or name)
    return name


def _create(aws: AwsClients, region: str, name: str, target: dict[str, str], when: datetime, description: str) -> str:
    """CreateSchedule; a schedule of the same name (the same attempt, provisioned again) is
    replaced. Returns its ARN."""
    from botocore.exceptions import ClientError

    kwargs: dict[str, Any] = {
        "Name": name,
        "GroupName": GROUP,
        "ScheduleExpression": at_expression(when),
        "ScheduleExpressionTimezone": "UTC",
        "FlexibleTimeWindow": {"Mode": "OFF"},
        "ActionAfterCompletion": "DELETE",
        "State": "ENABLED",
        "Description": description,
        "Target": target,
    }
    try:
        out = call(aws, "create_schedule", region, **kwargs)
    except ClientError as exc:
        if "Conflict" not in error_code(exc):
            raise
        delete_schedule(aws, region, name)
        out = call(aws, "create_schedule", region, **kwargs)
    return str(out.get("ScheduleArn") or name)


def _warn_once(warn: Callable[[str], None], journal: Journal, run_id: str, exc: BaseException) -> None:
    message = (
        f"AWS did not create the deadline schedule (the cloud-side backstop that terminates the run's "
        f"instances after its expiry): {describe(exc) if error_code(exc) else exc}. The run goes on; "
        f"the VM's own deadline and `gpucloud gc` still apply. {FIX}"
    )
    try:
        journal.event(run_id, "warning", message)
    except Exception:  # noqa: BLE001 - a warning must never stop a launch
        pass
    if "warned" not in _WARNED:
        _WARNED.add("warned")
        warn(message)


def delete_schedule(aws: AwsClients, region: str, name: str) -> None:
    """DeleteSchedule; ResourceNotFoundException means it is gone already (it fired, or gc)."""
    from botocore.exceptions import ClientError

    try:
        call(aws, "delete_schedule", region, Name=name, GroupName=GROUP)
    except ClientError as exc:
        if "ResourceNotFound" not in error_code(exc):
            raise


def stale_schedules(aws: AwsClients, region: str, now: datetime) -> dict[str, dict[str, str]]:
    """gpucloud's schedules of the region whose time is more than STALE_AFTER past: name ->
    {run tag, expiry tag} for gc's report. Raises what the scheduler raises (gc notes it)."""
    from botocore.exceptions import ClientError

    found: dict[str, dict[str, str]] = {}
    kwargs: dict[str, Any] = {"NamePrefix": PREFIX, "GroupName": GROUP}
    while True:
        page = call(aws, "list_schedules", region, **kwargs)
        for item in page.get("Schedules", []):
            name = str(item.get("Name", ""))
            if not name.startswith(PREFIX):
                continue
            try:
                sched = call(aws, "get_schedule", region, Name=name, GroupName=GROUP)
            except ClientError as exc:
                if "ResourceNotFound" in error_code(exc):
                    continue  # it fired and deleted itself meanwhile
                raise
            when = parse_at(str(sched.get("ScheduleExpression", "")), sched.get("ScheduleExpressionTimezone"))
            if when is not None and when + STALE_AFTER < now:
                run = re.match(r"gpucloud run (\S+) ", str(sched.get("Description", "")))
                found[name] = {TAG_RUN: run.group(1) if run else "?", TAG_EXPIRES: expiry_tag(when)}
        if not page.get("NextToken"):
            return found
        kwargs["NextToken"] = page["NextToken"]


def collapse_skips(lines: list[str]) -> list[str]:
    """gc's per-region "not swept" notes as one line (the same refusal in every region)."""
    skipped = [line for line in lines if SKIPPED in line]
    if len(skipped) <= 1:
        return lines
    why = skipped[0].split(f"{SKIPPED} (", 1)[-1].rstrip(")")
    rest = [line for line in lines if SKIPPED not in line]
    return rest + [f"aws: {SKIPPED} in {len(skipped)} regions ({why})"]
