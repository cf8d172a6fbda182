"""RunInstances for an attempt: all N nodes in one call, one zone at a time (docs/PROVIDERS.md,
"AWS launch").

MinCount = MaxCount = N makes the call all or nothing, so a capacity error moves the whole group to
the next zone. Every node boots the same user-data and takes its rank from its launch index (IMDS
`ami-launch-index`), which is also the rank order of the returned ids. A ClientToken per attempt
and zone stays the same across retries, so a retried RunInstances never starts a second, paid
machine. IMDSv2 is required with hop limit 1, the root volume is encrypted gp3, and the VM's own
`shutdown -h now` terminates it (InstanceInitiatedShutdownBehavior=terminate). A multi-node
launch on a type with EFA carries one EFA interface per EFA network card (efa.py), and each node
then gets an Elastic IP, since AWS gives no public address to an instance with several interfaces.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpucloud.contract.provider import CapacityError, LaunchRequest, RunHandle
from gpucloud.providers.aws.efa import (
    EfaLayout,
    allocate_addresses,
    associate_addresses,
    network_interfaces,
    primary_interfaces,
)
from gpucloud.providers.aws.errors import error_code, error_kind, error_message
from gpucloud.providers.aws.identity import is_profile_propagating
from gpucloud.providers.aws.images import check_disk
from gpucloud.providers.aws.network import CLOUD, run_tags, tag_list
from gpucloud.providers.aws.session import AwsClients

if TYPE_CHECKING:
    from gpucloud.contract.provider import Journal


@dataclass(frozen=True)
class LaunchPlan:
    """What RunInstances needs besides the request: image, network objects and the user-data."""

    ami: str
    root_device: str
    sg_id: str
    user_data: bytes
    count: int
    placement_group: str | None = None
    key_name: str | None = None
    efa: EfaLayout = EfaLayout()  # the EFA cards to attach (empty: the subnet's one ENA interface)
    profile: str | None = None  # the node's instance profile (identity.py)


PROFILE_TRIES = 8  # RunInstances refusing a new instance profile: about 1+2+...+7 = 28 s in all


def client_token(run_id: str, attempt: int, zone: str, rank: int | None) -> str:
    """Same inputs, same token: every retry of one attempt in one zone reuses it (<= 64 chars)."""
    digest = hashlib.sha256(f"{run_id}|{attempt}|{zone}|{rank}".encode()).hexdigest()[:40]
    return f"gpucloud-{digest}"


def launch(
    aws: AwsClients,
    req: LaunchRequest,
    journal: Journal,
    handle: RunHandle,
    plan: LaunchPlan,
    zones: list[tuple[str, str | None]],
) -> list[str]:
    """All nodes in one zone or none, trying the zones in order; ids in rank order."""
    from botocore.exceptions import ClientError

    check_disk(handle.region, plan.ami, int(req.disk_gb))
    last: ClientError | None = None
    tried: list[str] = []
    several = len(network_interfaces(plan.efa, plan.sg_id, "-")) > 1 and all(subnet for _, subnet in zones)
    allocs = allocate_addresses(aws, req, journal, handle, plan.count) if several else []
    for zone, subnet in zones:
        try:
            instances = run_instances(aws, req, journal, handle.region, plan, zone, subnet)
        except ClientError as exc:
            if error_kind(error_code(exc)) != "capacity":
                raise
            last = exc
            tried.append(zone or "default zone")
            continue
        handle.zone = zone or None
        handle.nodes = [str(i["InstanceId"]) for i in instances]
        if allocs:  # several interfaces: AWS gives the node no public address of its own
            associate_addresses(aws, handle.region, allocs, primary_interfaces(instances))
        return handle.nodes
    assert last is not None
    what = f"{plan.count} nodes together" if plan.count > 1 else "the instance"
    raise CapacityError(
        f"{req.region}/{req.instance_type}{' (spot)' if req.spot else ''}: no capacity for {what} in "
        f"{', '.join(tried)} ({error_code(last)}: {error_message(last)})",
        code=error_code(last),
    )


def run_instances(
    aws: AwsClients, req: LaunchRequest, journal: Journal, region: str, plan: LaunchPlan, zone: str, subnet: str | None
) -> list[dict[str, Any]]:
    """One RunInstances call for the plan's nodes; the instances sorted by AmiLaunchIndex (= rank)."""
    from botocore.exceptions import ClientError

    name = req.tags.get("Name") or f"gpucloud-{req.run_id}"
    kwargs = _run_instances_args(req, plan, zone, subnet, tag_list(run_tags(req, name)))
    intents = [journal.intent(req.run_id, "instance", f"{name}-node{r}", region, CLOUD) for r in range(plan.count)]
    try:
        out = _run_with_profile(aws, region, kwargs)
    except ClientError:
        for res in intents:  # AWS answered "no": nothing was created
            journal.deleted(res)
        raise
    instances: list[dict[str, Any]] = sorted(out["Instances"], key=lambda i: i.get("AmiLaunchIndex", 0))
    for res, inst in zip(intents, instances, strict=False):
        journal.created(res, str(inst["InstanceId"]))
    return instances


def _run_instances_args(
    req: LaunchRequest, plan: LaunchPlan, zone: str, subnet: str | None, tags: list[dict[str, str]]
) -> dict[str, Any]:
    """RunInstances' arguments: an encrypted root disk, IMDSv2 only, shutdown terminates, the run's tags
    on every resource it creates; the network interfaces (EFA), placement, key, profile and spot terms
    the plan asks for."""
    kwargs: dict[str, Any] = {
        "ImageId": plan.ami,
        "InstanceType": req.instance_type,
        "MinCount": plan.count,
        "MaxCount": plan.count,
        "ClientToken": client_token(req.run_id, req.attempt, zone, None),
        "UserData": plan.user_data,
        "SecurityGroupIds": [plan.sg_id],
        "InstanceInitiatedShutdownBehavior": "terminate",
        "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 1, "HttpEndpoint": "enabled"},
        "BlockDeviceMappings": [
            {
                "DeviceName": plan.root_device,
                "Ebs": {
                    "VolumeSize": int(req.disk_gb),
                    "VolumeType": "gp3",
                    "Encrypted": True,
                    "DeleteOnTermination": True,
                },
            }
        ],
        "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}, {"ResourceType": "volume", "Tags": tags}],
    }
    nics = network_interfaces(plan.efa, plan.sg_id, subnet) if subnet else []
    if nics:  # the groups and subnet go on each interface, never beside them
        del kwargs["SecurityGroupIds"]
        if len(nics) == 1:
            nics[0]["AssociatePublicIpAddress"] = True  # allowed with one interface only
        kwargs["NetworkInterfaces"] = nics
        kwargs["TagSpecifications"].append({"ResourceType": "network-interface", "Tags": tags})
    elif subnet:
        kwargs["SubnetId"] = subnet
    if plan.placement_group:
        kwargs["Placement"] = {"GroupName": plan.placement_group}
    if plan.key_name:
        kwargs["KeyName"] = plan.key_name
    if plan.profile:
        kwargs["IamInstanceProfile"] = {"Name": plan.profile}
    if req.spot:
        options: dict[str, str] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
        if req.max_price_per_hour:  # else AWS's cap: the on-demand price (docs/PROVIDERS.md)
            options["MaxPrice"] = f"{float(req.max_price_per_hour):.4f}"
        kwargs["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
    return kwargs


def _run_with_profile(aws: AwsClients, region: str, kwargs: dict[str, Any]) -> Any:
    """RunInstances, again while EC2 does not yet see a new instance profile (IAM is eventually
    consistent: docs/PROVIDERS.md, "AWS node identity"); the ClientToken keeps retries to one launch."""
    for i in range(PROFILE_TRIES):
        try:
            return aws.ec2("run_instances", region, **kwargs)
        except Exception as exc:
            if i == PROFILE_TRIES - 1 or not is_profile_propagating(exc):
                raise
            aws.sleep(float(i + 1))
    raise AssertionError("unreachable")
