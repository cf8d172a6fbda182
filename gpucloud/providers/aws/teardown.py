"""Teardown of one attempt from its RunHandle, and gc of everything expired by tag; both delete
through the one reaper (docs/PROVIDERS.md, "AWS teardown").

A complete handle is the whole truth: only the kinds it lists are looked at, so a single-node run
(no placement group) never calls DescribePlacementGroups. A partial handle (a crash before
provision returned) is widened with the journal's rows and the run's tags, again only for the
kinds the journal says were being created. The deadline schedule (deadline.py) goes last, once
the instances it would terminate are gone; one the scheduler refuses to delete is left to fire
harmlessly (and to gc), with an event, rather than failing the teardown.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucloud.contract.provider import TAG_EXPIRES, TAG_RUN, RunHandle
from gpucloud.contract.tags import tagged_expiry
from gpucloud.errors import CloudAccessError
from gpucloud.providers.aws.deadline import SCHEDULE, SKIPPED, role_setting, stale_schedules
from gpucloud.providers.aws.efa import EIP
from gpucloud.providers.aws.errors import AwsTeardownError, describe
from gpucloud.providers.aws.identity import ROLE, node_roles
from gpucloud.providers.aws.network import CLOUD, KEY, PG, SG, TAG_ATTEMPT, tag_dict
from gpucloud.providers.aws.reaper import INSTANCE, LABELS, Outcome, Targets, reap
from gpucloud.providers.aws.session import AwsClients
from gpucloud.ui.untrusted import shown

if TYPE_CHECKING:
    from gpucloud.contract.provider import Journal
    from gpucloud.state.records import ResourceRecord

PG_GONE_STATES = ("deleting", "deleted")
LIVE_STATES = ["pending", "running", "shutting-down", "stopping", "stopped"]


def _by_tag(
    aws: AwsClients, region: str, op: str, key: str, id_field: str, filters: list[dict[str, Any]]
) -> list[tuple[str, dict[str, str]]]:
    """(id, tags) of every object a Describe call returns for the filters (paginated)."""
    found: list[tuple[str, dict[str, str]]] = []
    kwargs: dict[str, Any] = {"Filters": filters}
    while True:
        page = aws.ec2(op, region, **kwargs)
        if key == "Reservations":
            items = [i for r in page.get("Reservations", []) for i in r.get("Instances", [])]
        else:
            items = [i for i in page.get(key, []) if i.get("State") not in PG_GONE_STATES]
        found += [(str(i[id_field]), tag_dict(i.get("Tags"))) for i in items]
        if not page.get("NextToken"):
            return found
        kwargs["NextToken"] = page["NextToken"]


def run_instances(aws: AwsClients, run_id: str, region: str) -> list[str]:
    """Ids of the run's live instances found by tag."""
    flt: list[dict[str, Any]] = [
        {"Name": f"tag:{TAG_RUN}", "Values": [run_id]},
        {"Name": "instance-state-name", "Values": LIVE_STATES},
    ]
    return [i for i, _ in _by_tag(aws, region, "describe_instances", "Reservations", "InstanceId", flt)]


def attempt_instances(aws: AwsClients, run_id: str, region: str, attempt: int) -> list[str]:
    """Ids of one attempt's instances (terminated ones too) found by tag, in rank order (launch
    index): the machines of an attempt cut short before its handle was stored, and not an earlier
    attempt's, which may be gone while this one runs."""
    flt = [
        {"Name": f"tag:{TAG_RUN}", "Values": [run_id]},
        {"Name": f"tag:{TAG_ATTEMPT}", "Values": [str(attempt)]},
    ]
    found: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"Filters": flt}
    while True:
        page = aws.ec2("describe_instances", region, **kwargs)
        found += [i for r in page.get("Reservations", []) for i in r.get("Instances", [])]
        if not page.get("NextToken"):
            return [str(i["InstanceId"]) for i in sorted(found, key=lambda i: i.get("AmiLaunchIndex", 0))]
        kwargs["NextToken"] = page["NextToken"]


def targets_for(aws: AwsClients, handle: RunHandle, records: list[ResourceRecord]) -> Targets:
    """What to delete for this handle: its own lists, and for a partial handle also the journal's
    rows and whatever carries the run's tag, for the kinds the journal names."""
    res = handle.resources
    targets = Targets(
        instances=list(handle.nodes),
        security_groups=list(res.get(SG, [])),
        placement_groups=list(res.get(PG, [])),
        addresses=list(res.get(EIP, [])),
        key_pairs=list(res.get(KEY, [])),
        schedules=list(res.get(SCHEDULE, [])),
        roles=list(res.get(ROLE, [])),
    )
    if handle.complete:
        return targets
    kinds = {r.kind for r in records} | set(res)
    run_tag = [{"Name": f"tag:{TAG_RUN}", "Values": [handle.run_id]}]
    targets.instances += [
        r.cloud_id for r in records if r.kind == INSTANCE and r.cloud_id and r.cloud_id.startswith("i-")
    ]
    targets.instances += run_instances(aws, handle.run_id, handle.region)
    targets.security_groups += [r.cloud_id for r in records if r.kind == SG and r.cloud_id]
    targets.security_groups += [
        i for i, _ in _by_tag(aws, handle.region, "describe_security_groups", "SecurityGroups", "GroupId", run_tag)
    ]
    if PG in kinds:
        targets.placement_groups += [r.name for r in records if r.kind == PG and r.name and r.cloud_id]
        targets.placement_groups += [
            i
            for i, _ in _by_tag(
                aws, handle.region, "describe_placement_groups", "PlacementGroups", "GroupName", run_tag
            )
        ]
    if EIP in kinds:
        targets.addresses += [r.cloud_id for r in records if r.kind == EIP and r.cloud_id]
        targets.addresses += [
            i for i, _ in _by_tag(aws, handle.region, "describe_addresses", "Addresses", "AllocationId", run_tag)
        ]
    if KEY in kinds:
        targets.key_pairs += [r.name for r in records if r.kind == KEY and r.name and r.cloud_id]
        targets.key_pairs += [
            i for i, _ in _by_tag(aws, handle.region, "describe_key_pairs", "KeyPairs", "KeyName", run_tag)
        ]
    targets.schedules += [r.name for r in records if r.kind == SCHEDULE and r.name]  # intents too: gone is fine
    targets.roles += [r.name for r in records if r.kind == ROLE and r.name]  # by name: intents too
    for name in ("instances", "security_groups", "placement_groups", "addresses", "key_pairs", "schedules", "roles"):
        setattr(targets, name, sorted(set(getattr(targets, name))))
    return targets


def teardown_handle(aws: AwsClients, handle: RunHandle, journal: Journal, keys_dir: Path, *, wait: bool) -> None:
    """Delete what the handle lists (see the module doc); journal rows of what is gone are closed.
    Objects in S3 stay: `gpucloud logs RUN` reads them later; the bucket's lifecycle rule expires them."""
    from botocore.exceptions import BotoCoreError, ClientError

    run_id, region = handle.run_id, handle.region
    records = [r for r in journal.resources(handle.run_id) if r.cloud == CLOUD and (r.region or region) == region]
    problems: list[str] = []
    try:
        targets = targets_for(aws, handle, records)
    except (ClientError, BotoCoreError) as exc:
        problems.append(f"listing the run's resources: {describe(exc)}")
        targets = targets_for(
            aws, RunHandle(run_id, CLOUD, region, handle.attempt, handle.zone, handle.nodes, handle.resources), records
        )
    outcomes = reap(aws, region, targets, wait=wait)
    for o in outcomes:
        label = f"{LABELS[o.kind]} {o.ident}"
        if o.kept and o.kind != INSTANCE:
            journal.event(run_id, "teardown", f"{label} left until its instances are gone")
        if o.kind == SCHEDULE and not o.done and not o.kept:  # refused: harmless, not a failed teardown
            journal.event(
                run_id,
                "teardown",
                f"{label} left ({o.why}): it fires on terminated instances and `gpucloud gc` removes it after its time",
            )
        elif not o.done and (wait or not o.kept):
            problems.append(f"{label}: {o.why}")
    pattern = f"gpucloud-{run_id}-{region}-{handle.attempt if handle.complete else '*'}.pem"
    for path in keys_dir.glob(pattern) if keys_dir.is_dir() else []:
        path.unlink(missing_ok=True)
    _close_journal_rows(journal, handle, records, outcomes, clean=not problems)
    if problems:
        raise AwsTeardownError(
            f"teardown of run {run_id} in {region} is incomplete:\n  " + "\n  ".join(problems),
            hint=f"Run `gpucloud down {run_id}` again; everything left carries the tag {TAG_RUN}={run_id} "
            "and `gpucloud gc` removes it once it has expired.",
        )


def _close_journal_rows(
    journal: Journal, handle: RunHandle, records: list[ResourceRecord], outcomes: list[Outcome], *, clean: bool
) -> None:
    """Mark deleted what the reaper deleted, and (when nothing went wrong) intents whose create
    never happened: all of the run's for a partial handle (the tags were searched), only this
    attempt's named objects for a complete one."""
    done = {(o.kind, o.ident) for o in outcomes if o.done or (o.kind == SCHEDULE and not o.kept)}
    mine = f"gpucloud-{handle.run_id}-{handle.attempt}"
    for r in records:
        ident = r.name if r.kind in (PG, KEY, SCHEDULE, ROLE) else r.cloud_id
        if (r.cloud_id or r.kind in (SCHEDULE, ROLE)) and (r.kind, ident) in done:
            journal.deleted(r.id)
        elif (
            r.cloud_id is None
            and clean
            and r.kind in (INSTANCE, SG, PG, KEY, EIP)
            and (
                not handle.complete
                or (r.kind != INSTANCE and (r.name == mine or f"{r.name}".startswith(f"{mine}-node")))
            )
        ):
            journal.deleted(r.id)


Roles = list[tuple[str, dict[str, str]]]  # (name, tags) of node roles


def gc_roles(aws: AwsClients, regions: list[str]) -> dict[str, Roles | str]:
    """Each region's node roles from one IAM listing, or for every region why IAM refused it."""
    from botocore.exceptions import ClientError

    try:
        return dict(node_roles(aws, regions))
    except ClientError as exc:
        return dict.fromkeys(regions, describe(exc))


def gc_region(aws: AwsClients, region: str, now: datetime, dry_run: bool, roles: Roles | str) -> list[str]:
    """Find (and unless dry_run delete) every tagged resource in `region` whose expiry has passed;
    `roles` are the region's node roles (identity.node_roles: IAM is listed once for all regions),
    or why they could not be listed."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        targets, tags, unchecked = gc_find(aws, region, now, roles)
    except (ClientError, BotoCoreError) as exc:
        return [f"aws/{region}: skipped ({describe(exc)})"]
    notes = [f"aws/{region}: {NOT_CHECKED} {op} ({why})" for op, why in unchecked.items()]
    if role_setting() is not None:  # the layer is off: nothing of it to sweep
        try:
            stale = stale_schedules(aws, region, now)
        except (ClientError, BotoCoreError, CloudAccessError) as exc:
            notes.append(f"aws/{region}: {SKIPPED} ({describe(exc) if isinstance(exc, ClientError) else exc})")
        else:
            targets.schedules += sorted(stale)
            tags.update(stale)

    def line(kind: str, ident: str, verb: str, why: str = "") -> str:
        t = tags.get(ident, {})
        label = f"{LABELS[kind]} {ident} (run {t.get(TAG_RUN, '?')}, expired {t.get(TAG_EXPIRES, '?')})"
        return f"aws/{region}: {verb} {label}{(': ' + why) if why else ''}"

    notes += [f"aws/{region}: {why}" for why in targets.skipped]
    if dry_run:
        return [line(kind, ident, "would delete") for kind, ident in targets.items()] + notes
    return [
        line(o.kind, o.ident, "deleted" if o.done else "could not delete", o.why)
        for o in reap(aws, region, targets, wait=True)
    ] + notes


def gc_find(
    aws: AwsClients, region: str, now: datetime, roles: Roles | str
) -> tuple[Targets, dict[str, dict[str, str]], dict[str, str]]:
    """Every object of the region tagged gpucloud-expires < now, the tags of each, and the calls
    that could not be made here with why (one unsupported or refused call leaves the others' finds)."""
    flt: list[dict[str, Any]] = [{"Name": "tag-key", "Values": [TAG_EXPIRES]}]
    unchecked: dict[str, str] = {}

    def listed(op: str, key: str, id_field: str, filters: list[dict[str, Any]]) -> list[tuple[str, dict[str, str]]]:
        try:
            return _by_tag(aws, region, op, key, id_field, filters)
        except CloudAccessError:  # no credentials, no endpoint: nothing here can be checked
            raise
        except Exception as exc:  # noqa: BLE001 - named per call, and gc exits 75 (gc-incomplete)
            unchecked[call_name(op)] = call_failure(exc)
            return []

    found = {
        "instances": listed(
            "describe_instances",
            "Reservations",
            "InstanceId",
            flt + [{"Name": "instance-state-name", "Values": LIVE_STATES}],
        ),
        "security_groups": listed("describe_security_groups", "SecurityGroups", "GroupId", flt),
        "placement_groups": listed("describe_placement_groups", "PlacementGroups", "GroupName", flt),
        "key_pairs": listed("describe_key_pairs", "KeyPairs", "KeyName", flt),
        "addresses": listed("describe_addresses", "Addresses", "AllocationId", flt),
        "volumes": listed(
            "describe_volumes", "Volumes", "VolumeId", flt + [{"Name": "status", "Values": ["available", "error"]}]
        ),
    }
    targets = Targets()
    tags: dict[str, dict[str, str]] = {}
    if isinstance(roles, str):  # IAM refused (a policy from before node roles): the rest is still swept
        targets.skipped.append(f"node roles not listed ({roles})")
    else:
        found["roles"] = roles
    for name, items in found.items():
        for ident, t in items:
            when, why = tagged_expiry(t)
            if why:  # not gpucloud's as it writes them: named by gc_region, never deleted
                targets.skipped.append(f"{name[:-1].replace('_', ' ')} {shown(ident, limit=100)} left alone: {why}")
            elif when is not None and when < now:
                getattr(targets, name).append(ident)
                tags[ident] = t
    return targets, tags, unchecked


NOT_CHECKED = "could not check"  # gc's per-region note of a call that failed (collected by not_checked)


def call_name(op: str) -> str:
    """`describe_placement_groups` -> `DescribePlacementGroups`, as the API and IAM name it."""
    return "".join(part.capitalize() for part in op.split("_"))


def _what(call: str) -> str:
    """`DescribePlacementGroups` -> `placement groups`: what the call lists."""
    import re

    return re.sub(r"(?<!^)([A-Z])", r" \1", call.removeprefix("Describe")).lower()


def call_failure(exc: BaseException) -> str:
    """Why one call failed, in a line: the AWS error code and message, or that the endpoint's answer
    was not an AWS response at all (an HTML error page: never printed as it came)."""
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        return describe(exc)
    if type(exc).__name__ == "ResponseParserError":
        return "the endpoint's answer was not an AWS response (an error page, not XML)"
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return shown(f"{type(exc).__name__}: {first}", limit=200)


def not_checked(lines: list[str], regions: int) -> tuple[list[str], list[str]]:
    """gc's lines without the per-region "could not check" notes, and one failure per call that
    names in how many regions it failed and why (the first region's reason)."""
    rest: list[str] = []
    calls: dict[str, list[str]] = {}
    for line in lines:
        if f": {NOT_CHECKED} " not in line:
            rest.append(line)
            continue
        call, why = line.split(f": {NOT_CHECKED} ", 1)[1].split(" ", 1)
        calls.setdefault(call, []).append(why[1:-1] if why.startswith("(") and why.endswith(")") else why)
    failures = [
        f"aws: {call} could not be checked in {len(whys)} of {regions} region(s) ({whys[0]}): expired "
        f"{_what(call)} there, if any, were not seen"
        for call, whys in calls.items()
    ]
    return rest, failures
