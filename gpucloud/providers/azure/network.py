"""An attempt's shared resources, created once before its nodes: the resource group, the NSG, the
VNet with its one subnet and, for a multi-node job, the proximity placement group (one datacenter,
low latency between nodes) and, on InfiniBand sizes, the availability set in it (RDMA between VMs
needs them in one availability set or scale set: azure-compute-docs setup-infiniband.md). All of
them live in the group, so they go when the group goes (teardown, gc, the last node's self-delete)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpucloud.providers.azure.arm import Arm, tracked
from gpucloud.providers.azure.machine import SUBNET_PREFIX, VNET_PREFIX

if TYPE_CHECKING:
    from gpucloud.contract.provider import Journal, LaunchRequest

PLACEMENT_GROUP = "ppg"
AVAILABILITY_SET = "avset"


def create_group(arm: Arm, journal: Journal, req: LaunchRequest, rg: str, tags: dict[str, str]) -> None:
    """The attempt's resource group, in the candidate's region."""
    region = req.region
    tracked(
        arm,
        journal,
        req.run_id,
        region,
        "resource_group",
        rg,
        lambda: arm.resource.resource_groups.create_or_update(rg, {"location": region, "tags": tags}).id,
    )


def create_nsg(arm: Arm, journal: Journal, req: LaunchRequest, rg: str, nsg: dict[str, Any]) -> str:
    """The network security group (body from machine.nsg_body); returns its id."""
    nsg_id: str = tracked(
        arm,
        journal,
        req.run_id,
        req.region,
        "nsg",
        "nsg",
        lambda: arm.network.network_security_groups.begin_create_or_update(rg, "nsg", nsg).result().id,
    )
    return nsg_id


def vnet_body(region: str, tags: dict[str, str], nsg_id: str) -> dict[str, Any]:
    """One VNet with one subnet ("default") behind the attempt's NSG."""
    return {
        "location": region,
        "tags": tags,
        "properties": {
            "addressSpace": {"addressPrefixes": [VNET_PREFIX]},
            "subnets": [
                {
                    "name": "default",
                    "properties": {
                        "addressPrefix": SUBNET_PREFIX,
                        "networkSecurityGroup": {"id": nsg_id},
                    },
                }
            ],
        },
    }


def create_vnet(arm: Arm, journal: Journal, req: LaunchRequest, rg: str, tags: dict[str, str], nsg_id: str) -> str:
    """The virtual network; returns the id of its subnet, which every node's NIC joins."""
    region = req.region
    vnet = tracked(
        arm,
        journal,
        req.run_id,
        region,
        "vnet",
        "vnet",
        lambda: (
            arm.network.virtual_networks.begin_create_or_update(rg, "vnet", vnet_body(region, tags, nsg_id)).result().id
        ),
    )
    return f"{vnet}/subnets/default"


def create_placement_group(arm: Arm, journal: Journal, req: LaunchRequest, rg: str, tags: dict[str, str]) -> str:
    """The proximity placement group a multi-node job's VMs share; returns its id."""
    region = req.region
    body = {
        "location": region,
        "tags": tags,
        "properties": {
            "proximityPlacementGroupType": "Standard",
            "intent": {"vmSizes": [req.instance_type]},
        },
    }
    ppg_id: str = tracked(
        arm,
        journal,
        req.run_id,
        region,
        "placement_group",
        PLACEMENT_GROUP,
        lambda: arm.compute.proximity_placement_groups.create_or_update(rg, PLACEMENT_GROUP, body).id,
    )
    return ppg_id


def availability_set_body(region: str, tags: dict[str, str], ppg_id: str) -> dict[str, Any]:
    """One fault and update domain keeps the nodes together on one InfiniBand fabric; `Aligned`
    is the sku managed-disk VMs require; the set sits in the run's proximity placement group (a VM
    in both must name the same group)."""
    return {
        "location": region,
        "tags": tags,
        "sku": {"name": "Aligned"},
        "properties": {
            "platformFaultDomainCount": 1,
            "platformUpdateDomainCount": 1,
            "proximityPlacementGroup": {"id": ppg_id},
        },
    }


def create_availability_set(
    arm: Arm, journal: Journal, req: LaunchRequest, rg: str, tags: dict[str, str], ppg_id: str
) -> str:
    """The availability set an InfiniBand multi-node job's VMs share; returns its id."""
    region = req.region
    body = availability_set_body(region, tags, ppg_id)
    avset_id: str = tracked(
        arm,
        journal,
        req.run_id,
        region,
        "availability_set",
        AVAILABILITY_SET,
        lambda: arm.compute.availability_sets.create_or_update(rg, AVAILABILITY_SET, body).id,
    )
    return avset_id
