"""What a run's machines sit in: its security group (and rules), the cluster placement group of a
multi-node run, and the SSH key pair when `ssh: true` (docs/PROVIDERS.md, "AWS network").

Each create is journalled before the call (a crash right after it still gets it deleted) and
recorded in the attempt's RunHandle, the list teardown works from. Every object carries the run's
tags, so `down` and `gc` also find it without the local state store.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpucloud.contract.provider import (
    TAG_EXPIRES,
    TAG_RUN,
    LaunchRequest,
    RunHandle,
    expiry_tag,
    ssh_source_cidr,
)
from gpucloud.providers.aws.errors import error_code
from gpucloud.providers.aws.session import AwsClients

if TYPE_CHECKING:
    from gpucloud.contract.provider import Journal

CLOUD = "aws"
TAG_ATTEMPT = "gpucloud-attempt"
PLACEMENT_STRATEGY = "cluster"  # low-latency, high-bandwidth network between the nodes of one zone
SG, PG, KEY = "security-group", "placement-group", "key-pair"  # RunHandle resource kinds


def object_name(req: LaunchRequest) -> str:
    """The name of the attempt's security group, placement group and key pair."""
    return f"gpucloud-{req.run_id}-{req.attempt}"


def run_tags(req: LaunchRequest, name: str) -> dict[str, str]:
    """The tags of everything the attempt creates: run, expiry, attempt and Name."""
    return {
        **req.tags,
        TAG_RUN: req.run_id,
        TAG_EXPIRES: expiry_tag(req.expires_at),
        TAG_ATTEMPT: str(req.attempt),
        "Name": name,
    }


def tag_spec(kind: str, req: LaunchRequest, name: str) -> list[dict[str, object]]:
    return [{"ResourceType": kind, "Tags": tag_list(run_tags(req, name))}]


def tag_list(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def tag_dict(tags: list[dict[str, str]] | None) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in tags or []}


def security_group(aws: AwsClients, req: LaunchRequest, journal: Journal, handle: RunHandle, vpc_id: str) -> str:
    """The attempt's own group, with no inbound rule (the VM only talks out, to presigned URLs)."""
    from botocore.exceptions import ClientError

    region = handle.region
    name = object_name(req)
    res = journal.intent(req.run_id, SG, name, region, CLOUD)
    try:
        sg_id = aws.ec2(
            "create_security_group",
            region,
            GroupName=name,
            VpcId=vpc_id,
            Description=f"gpucloud run {req.run_id}: no inbound rules, outbound only",
            TagSpecifications=tag_spec(SG, req, name),
        )["GroupId"]
    except ClientError as exc:
        if "InvalidGroup.Duplicate" not in error_code(exc):
            raise
        # A retried attempt: the group is ours (same run, same attempt); reuse it.
        groups = aws.ec2(
            "describe_security_groups",
            region,
            Filters=[{"Name": "group-name", "Values": [name]}, {"Name": f"tag:{TAG_RUN}", "Values": [req.run_id]}],
        )["SecurityGroups"]
        if not groups:
            raise
        sg_id = groups[0]["GroupId"]
    handle.add(SG, sg_id)
    journal.created(res, sg_id)
    return str(sg_id)


def _ingress(
    aws: AwsClients,
    req: LaunchRequest,
    region: str,
    sg_id: str,
    permission: dict[str, object],
    op: str = "authorize_security_group_ingress",
) -> None:
    """One inbound (or, with `op`, outbound) rule; a duplicate means a retried attempt that reuses
    its group already has it."""
    from botocore.exceptions import ClientError

    try:
        aws.ec2(
            op,
            region,
            GroupId=sg_id,
            IpPermissions=[permission],
            TagSpecifications=tag_spec("security-group-rule", req, object_name(req)),
        )
    except ClientError as exc:
        if "InvalidPermission.Duplicate" not in error_code(exc):
            raise


def intra_run_rule(aws: AwsClients, req: LaunchRequest, region: str, sg_id: str) -> None:
    """All traffic from the group to itself, in and out: the run's own nodes (and only they, since
    no other machine carries this group) reach each other on any port, as torchrun and NCCL need.
    The outbound rule naming the group itself is what EFA asks for besides the inbound one [EC2
    User Guide, "Prepare an EFA-enabled security group"]; the group's default allow-all outbound
    rule stays."""
    own: dict[str, object] = {
        "IpProtocol": "-1",
        "UserIdGroupPairs": [{"GroupId": sg_id, "Description": "gpucloud: the run's own nodes"}],
    }
    _ingress(aws, req, region, sg_id, own)
    _ingress(aws, req, region, sg_id, own, "authorize_security_group_egress")


def placement_group(aws: AwsClients, req: LaunchRequest, journal: Journal, handle: RunHandle) -> str:
    """A cluster placement group for a multi-node attempt (one zone, one low-latency segment)."""
    from botocore.exceptions import ClientError

    name = object_name(req)
    res = journal.intent(req.run_id, PG, name, handle.region, CLOUD)
    try:
        out = aws.ec2(
            "create_placement_group",
            handle.region,
            GroupName=name,
            Strategy=PLACEMENT_STRATEGY,
            TagSpecifications=tag_spec(PG, req, name),
        )
        ident = (out.get("PlacementGroup") or {}).get("GroupId") or name
    except ClientError as exc:
        if "InvalidPlacementGroup.Duplicate" not in error_code(exc):
            raise
        ident = name  # a retried attempt: the name carries the run id and attempt, so it is ours
    handle.add(PG, name)
    journal.created(res, ident)
    return name


def ssh_access(
    aws: AwsClients,
    req: LaunchRequest,
    journal: Journal,
    handle: RunHandle,
    sg_id: str,
    key_file: Path,
    public_ip: Callable[[], str] | None,
) -> str:
    """Port 22 from the caller's address only, and a fresh key pair whose private half is stored
    0600 at `key_file`. Returns the key pair's name."""
    region = handle.region
    cidr = ssh_source_cidr(public_ip)
    _ingress(
        aws,
        req,
        region,
        sg_id,
        {
            "IpProtocol": "tcp",
            "FromPort": 22,
            "ToPort": 22,
            "IpRanges": [{"CidrIp": cidr, "Description": "gpucloud ssh from the caller"}],
        },
    )
    name = object_name(req)
    res = journal.intent(req.run_id, KEY, name, region, CLOUD)
    out = aws.ec2(
        "create_key_pair", region, KeyName=name, KeyType="ed25519", TagSpecifications=tag_spec(KEY, req, name)
    )
    handle.add(KEY, name)
    journal.created(res, out.get("KeyPairId") or name)
    key_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(out["KeyMaterial"])
    os.chmod(key_file, 0o600)
    return name
