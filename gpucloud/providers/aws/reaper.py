"""The one deletion order for a run's AWS resources, used by teardown, by a failed attempt's
cleanup and by gc (docs/PROVIDERS.md, "AWS teardown").

Order: terminate the instances, wait until they are gone, then delete what they depended on
(security groups, placement groups: AWS refuses with DependencyViolation / InUse while an
instance still uses them, and Elastic IPs, whose release waits for the instance to let go), key
pairs, loose volumes, and last the deadline schedules
(deadline.py), which stay while an instance could not be terminated: they are its backstop. A
group whose instances are still terminating costs nothing and keeps its tags, so it is left for
the next `down` or `gc`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gpucloud.errors import CloudAccessError
from gpucloud.providers.aws.deadline import SCHEDULE, delete_schedule
from gpucloud.providers.aws.efa import EIP
from gpucloud.providers.aws.errors import describe, error_code
from gpucloud.providers.aws.identity import ROLE, delete_identity
from gpucloud.providers.aws.network import KEY, PG, SG
from gpucloud.providers.aws.session import AwsClients

INSTANCE, VOLUME = "instance", "volume"
LABELS = {
    INSTANCE: "instance",
    SG: "security group",
    PG: "placement group",
    EIP: "elastic IP",
    KEY: "key pair",
    VOLUME: "volume",
    SCHEDULE: "deadline schedule",
    ROLE: "node role",
}


@dataclass
class Targets:
    """What to delete in one region, by kind (the RunHandle's kinds plus volumes for gc)."""

    instances: list[str] = field(default_factory=list)
    security_groups: list[str] = field(default_factory=list)
    placement_groups: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)  # Elastic IP allocation ids
    key_pairs: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    schedules: list[str] = field(default_factory=list)  # EventBridge Scheduler names (group "default")
    roles: list[str] = field(default_factory=list)  # node roles (and their instance profiles), by name
    skipped: list[str] = field(default_factory=list)  # tagged, but not as gpucloud tags: named by gc, never deleted

    def items(self) -> list[tuple[str, str]]:
        """(kind, id) in deletion order."""
        return (
            [(INSTANCE, i) for i in self.instances]
            + [(SG, g) for g in self.security_groups]
            + [(PG, p) for p in self.placement_groups]
            + [(EIP, a) for a in self.addresses]
            + [(KEY, k) for k in self.key_pairs]
            + [(ROLE, r) for r in self.roles]
            + [(VOLUME, v) for v in self.volumes]
            + [(SCHEDULE, s) for s in self.schedules]
        )


@dataclass
class Outcome:
    """One resource after the reaper: deleted (`done`), kept for later, or failed (`why`)."""

    kind: str
    ident: str
    done: bool
    why: str = ""
    kept: bool = False


def reap(aws: AwsClients, region: str, targets: Targets, *, wait: bool) -> list[Outcome]:
    """Delete the targets in the one safe order; never raises for an AWS refusal (each one is an
    Outcome with its reason). Without `wait`, instances are only asked to terminate and what
    depends on them is kept unless they are already gone."""
    from botocore.exceptions import BotoCoreError, ClientError

    outcomes: list[Outcome] = []
    alive: list[str] = []
    failed: list[str] = []
    ids = sorted(set(targets.instances))
    if ids:
        try:
            terminate(aws, region, ids)
            alive = wait_terminated(aws, region, ids, aws.TERMINATE_TIMEOUT_S if wait else 0)
        except (ClientError, BotoCoreError) as exc:
            outcomes += [Outcome(INSTANCE, i, False, describe(exc)) for i in ids]
            alive = failed = ids
        else:
            late = f"still terminating after {aws.TERMINATE_TIMEOUT_S:.0f}s" if wait else "terminating"
            outcomes += [
                Outcome(INSTANCE, i, i not in alive, "" if i not in alive else late, kept=not wait) for i in ids
            ]
            failed = alive if wait else []
    dependents = (
        [(SG, g) for g in targets.security_groups]
        + [(PG, p) for p in targets.placement_groups]
        + [(EIP, a) for a in targets.addresses]
    )
    for kind, ident in dependents:
        if alive:
            outcomes.append(Outcome(kind, ident, False, f"instances {', '.join(alive)} are not terminated", kept=True))
            continue
        outcomes.append(_attempt(kind, ident, lambda k=kind, i=ident: _delete_dependent(aws, region, k, i)))
    for key in targets.key_pairs:
        outcomes.append(_attempt(KEY, key, lambda k=key: delete_key(aws, region, k)))
    for role in sorted(set(targets.roles)):  # a live node keeps its identity until it is gone
        if alive:
            outcomes.append(Outcome(ROLE, role, False, f"instances {', '.join(alive)} are not terminated", kept=True))
            continue
        outcomes.append(_attempt(ROLE, role, lambda r=role: delete_identity(aws, r)))
    for vol in targets.volumes:
        outcomes.append(_attempt(VOLUME, vol, lambda v=vol: aws.ec2("delete_volume", region, VolumeId=v)))
    for name in sorted(set(targets.schedules)):
        if failed:  # the instance's backstop stays until it is terminated
            outcomes.append(
                Outcome(SCHEDULE, name, False, f"instances {', '.join(failed)} are not terminated", kept=True)
            )
            continue
        outcomes.append(_delete_schedule(aws, region, name))
    return outcomes


def _delete_schedule(aws: AwsClients, region: str, name: str) -> Outcome:
    """A schedule's deletion as an Outcome; a scheduler that refuses the credentials or cannot be
    reached fails only this (EC2 answered, the instances are dealt with)."""
    try:
        return _attempt(SCHEDULE, name, lambda: delete_schedule(aws, region, name))
    except CloudAccessError as exc:
        return Outcome(SCHEDULE, name, False, str(exc))


def _attempt(kind: str, ident: str, fn: object) -> Outcome:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        fn()  # type: ignore[operator]
    except (ClientError, BotoCoreError) as exc:
        return Outcome(kind, ident, False, describe(exc))
    return Outcome(kind, ident, True)


def _delete_dependent(aws: AwsClients, region: str, kind: str, ident: str) -> None:
    """Delete (or release) what an instance used, retrying while AWS says it is still in use."""
    op, key, gone, busy = DEPENDENT_DELETES[kind]
    timeout = aws.PG_DELETE_TIMEOUT_S if kind == PG else aws.SG_DELETE_TIMEOUT_S
    delete_when_free(aws, region, op, {key: ident}, gone=gone, busy=busy, timeout=timeout)


# kind -> (operation, id parameter, error codes that mean already gone, the code that means in use)
DEPENDENT_DELETES: dict[str, tuple[str, str, tuple[str, ...], str]] = {
    SG: ("delete_security_group", "GroupId", ("InvalidGroup.NotFound", "InvalidGroupId"), "DependencyViolation"),
    PG: ("delete_placement_group", "GroupName", ("InvalidPlacementGroup.Unknown",), "InUse"),
    EIP: ("release_address", "AllocationId", ("InvalidAllocationID.NotFound",), "InvalidIPAddress.InUse"),
}


def terminate(aws: AwsClients, region: str, ids: list[str]) -> None:
    """TerminateInstances; an id AWS does not know is already gone (one unknown id fails the whole
    call, so then it goes one by one)."""
    from botocore.exceptions import ClientError

    if not ids:
        return
    try:
        aws.ec2("terminate_instances", region, InstanceIds=ids)
    except ClientError as exc:
        if "InvalidInstanceID" not in error_code(exc) or len(ids) == 1:
            if "InvalidInstanceID.NotFound" in error_code(exc):
                return
            raise
        for iid in ids:
            terminate(aws, region, [iid])


def instance_states(aws: AwsClients, region: str, ids: list[str]) -> dict[str, str]:
    """EC2 state name per id; ids AWS no longer lists are absent (a filter, so unknown ids do not fail)."""
    out = aws.ec2("describe_instances", region, Filters=[{"Name": "instance-id", "Values": ids}])
    return {i["InstanceId"]: i["State"]["Name"] for r in out.get("Reservations", []) for i in r["Instances"]}


def wait_terminated(aws: AwsClients, region: str, ids: list[str], timeout: float) -> list[str]:
    """Poll until every instance is terminated; returns the ones still alive at the timeout."""
    end = time.monotonic() + timeout
    alive = list(ids)
    while alive:
        states = instance_states(aws, region, alive)
        alive = [i for i in alive if states.get(i, "terminated") != "terminated"]
        if not alive or time.monotonic() >= end:
            break
        aws.sleep(aws.poll_s)
    return alive


def delete_when_free(
    aws: AwsClients, region: str, op: str, kwargs: dict[str, str], *, gone: tuple[str, ...], busy: str, timeout: float
) -> None:
    """A delete AWS refuses with `busy` while instances still use the thing: retry with backoff
    until `timeout`; an error code containing one of `gone` means already deleted."""
    from botocore.exceptions import ClientError

    end = time.monotonic() + timeout
    tries = 0
    while True:
        try:
            aws.ec2(op, region, **kwargs)
            return
        except ClientError as exc:
            code = error_code(exc)
            if any(g in code for g in gone):
                return
            if busy not in code or time.monotonic() >= end:
                raise
        aws.sleep(min(aws.RETRY_CAP_S, aws.backoff(tries) + aws.poll_s / 2))
        tries += 1


def delete_key(aws: AwsClients, region: str, name: str) -> None:
    from botocore.exceptions import ClientError

    try:
        aws.ec2("delete_key_pair", region, KeyName=name)
    except ClientError as exc:
        if "InvalidKeyPair.NotFound" not in error_code(exc):
            raise
