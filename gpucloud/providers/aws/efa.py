"""EFA for a multi-node run: which network cards of the instance type carry an Elastic Fabric
Adapter, the RunInstances `NetworkInterfaces` that attach them, and one Elastic IP per node
(docs/PROVIDERS.md, "AWS fast fabric").

Why each part:
- EFA interfaces can only be attached at launch, one per network card, up to the type's
  `NetworkInfo.EfaInfo.MaximumEfaInterfaces` (DescribeInstanceTypes: p5.48xlarge 32, p5en 16,
  p4d 4); cards whose `InterfaceTypes` list no "efa" are skipped (p6-b300's card 0) [EC2 User Guide,
  "Maximize network bandwidth on Amazon EC2 instances with multiple network cards"].
- The primary interface (card 0, device 0) is the combined `efa` type where card 0 supports it (EFA
  plus the ENA the node's IP traffic uses); every other card gets an `efa-only` interface at device
  index 0, which keeps the GPU traffic off IP and needs no address of its own.
- AWS assigns no public IPv4 address to an instance launched with more than one network interface
  (neither `AssociatePublicIpAddress` nor the default subnet's auto-assign). The node reaches S3
  through its public address in the default VPC, so each node of such a launch gets an Elastic IP
  on its primary interface (allocated before RunInstances, so an exhausted address quota costs no
  instance), tagged, journalled and released at teardown like every other object.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import TYPE_CHECKING, Any

from gpucloud.contract.provider import LaunchRequest, RunHandle
from gpucloud.providers.aws.errors import error_code
from gpucloud.providers.aws.network import CLOUD, run_tags, tag_list
from gpucloud.providers.aws.session import AwsClients

if TYPE_CHECKING:
    from gpucloud.contract.provider import Journal

EIP = "elastic-ip"  # RunHandle resource kind: allocation ids
ASSOCIATE_TRIES = 10  # the new interfaces can take a few seconds to be associable


@cache
def efa_counts() -> dict[str, int]:
    """catalog/data/efa.csv: the EFA interfaces of each GPU type, as DescribeInstanceTypes reports
    them; what `plan` shows (a launch reads the live answer instead)."""
    text = files("gpucloud.catalog").joinpath("data", "efa.csv").read_text(encoding="utf-8")
    return {r["instance_type"]: int(r["efa_interfaces"]) for r in csv.DictReader(io.StringIO(text))}


def fabric(instance_type: str, spot: bool = False) -> str:
    """The network a multi-node run's nodes of this type talk over (spot or not: EFA either way)."""
    count = efa_counts().get(instance_type, 0)
    return f"EFA ×{count}" if count else "TCP"


@dataclass(frozen=True)
class EfaLayout:
    """The network cards of an instance type that carry an EFA interface, card 0 first when it has one."""

    cards: tuple[int, ...] = ()
    primary_efa: bool = False  # card 0 carries the combined efa + ENA interface

    @property
    def count(self) -> int:
        return len(self.cards)


def layout_from(info: dict[str, Any]) -> EfaLayout:
    """The EFA cards of one DescribeInstanceTypes entry (no EFA: an empty layout)."""
    net = info.get("NetworkInfo") or {}
    most = int(((net.get("EfaInfo") or {}).get("MaximumEfaInterfaces")) or 0)
    if not net.get("EfaSupported") or most < 1:
        return EfaLayout()
    cards = sorted(net.get("NetworkCards") or [], key=lambda c: int(c.get("NetworkCardIndex", 0)))
    efa = [int(c.get("NetworkCardIndex", 0)) for c in cards if "efa" in (c.get("InterfaceTypes") or ["efa"])]
    if not cards:
        efa = [0]  # an answer without the card list: one EFA on the primary interface
    chosen = tuple(efa[:most])
    return EfaLayout(cards=chosen, primary_efa=bool(chosen) and chosen[0] == 0)


def efa_layout(aws: AwsClients, region: str, instance_type: str) -> EfaLayout:
    """The type's EFA layout as DescribeInstanceTypes reports it in this region."""
    out = aws.ec2("describe_instance_types", region, InstanceTypes=[instance_type])
    types = out.get("InstanceTypes") or []
    return layout_from(types[0]) if types else EfaLayout()


def network_interfaces(layout: EfaLayout, sg_id: str, subnet: str) -> list[dict[str, Any]]:
    """RunInstances `NetworkInterfaces`: the primary on card 0 (efa where card 0 supports it), then
    an efa-only interface on each further EFA card. Empty for a layout without EFA."""
    if not layout.cards:
        return []

    def nic(card: int, kind: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "NetworkCardIndex": card,
            "DeviceIndex": 0,
            "SubnetId": subnet,
            "Groups": [sg_id],
            "DeleteOnTermination": True,
            "InterfaceType": kind,
        }
        if kind == "interface":
            del out["InterfaceType"]  # the default: a plain ENA interface
        return out

    nics = [nic(0, "efa" if layout.primary_efa else "interface")]
    nics += [nic(card, "efa-only") for card in layout.cards if card != 0]
    return nics


def primary_interfaces(instances: list[dict[str, Any]]) -> list[str]:
    """The primary (card 0, device 0) interface id of each RunInstances instance, in the given order."""
    ids: list[str] = []
    for inst in instances:
        for nic in inst.get("NetworkInterfaces") or []:
            att = nic.get("Attachment") or {}
            if int(att.get("DeviceIndex", 0)) == 0 and int(att.get("NetworkCardIndex", 0)) == 0:
                ids.append(str(nic["NetworkInterfaceId"]))
                break
    return ids


def allocate_addresses(
    aws: AwsClients, req: LaunchRequest, journal: Journal, handle: RunHandle, count: int
) -> list[str]:
    """One tagged Elastic IP per node, allocated before RunInstances: a region's address quota
    (5 by default) then fails the attempt before any instance is paid for. Allocation ids, rank order."""
    allocs: list[str] = []
    for rank in range(count):
        name = f"gpucloud-{req.run_id}-{req.attempt}-node{rank}"
        res = journal.intent(req.run_id, EIP, name, handle.region, CLOUD)
        out = aws.ec2(
            "allocate_address",
            handle.region,
            Domain="vpc",
            TagSpecifications=[{"ResourceType": "elastic-ip", "Tags": tag_list(run_tags(req, name))}],
        )
        allocs.append(str(out["AllocationId"]))
        handle.add(EIP, allocs[-1])
        journal.created(res, allocs[-1])
    return allocs


def associate_addresses(aws: AwsClients, region: str, allocs: list[str], interfaces: list[str]) -> None:
    """Each node's Elastic IP on its primary interface: the node's way out to S3."""
    from botocore.exceptions import ClientError

    for alloc, eni in zip(allocs, interfaces, strict=True):
        for tries in range(ASSOCIATE_TRIES):
            try:
                aws.ec2("associate_address", region, AllocationId=alloc, NetworkInterfaceId=eni)
                break
            except ClientError as exc:
                if "InvalidNetworkInterfaceID" not in error_code(exc) or tries == ASSOCIATE_TRIES - 1:
                    raise
                aws.sleep(aws.poll_s)
