"""The ARM bodies gpucloud sends, read against azure-mgmt-compute's and azure-mgmt-network's own
models (every key must be a field of the SDK's model at that place, and enum values its enum's),
and the per-size choices in them: the security profile every VM carries, accelerated networking
on the NICs of sizes that support it, and the availability set (InfiniBand placement) of a
multi-node run on an ND size. The bodies are the ones the fake ARM server recorded, as sent."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpucloud.providers.azure import AzureProvider
from gpucloud.providers.azure.machine import vm_body
from gpucloud.providers.azure.sizes import (
    ACCELERATED,
    INFINIBAND,
    TCP,
    accelerated_networking,
    fabric,
    security_type,
)
from tests.support.azure_fixtures import (  # noqa: F401  (fixtures)
    arm,
    fake_arm_server,
    journal,
    launch_request,
    provider,
    run_resources,
)
from tests.support.fake_arm import FakeArm

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def unknown_keys(model: Any, data: Any, where: str = "") -> list[str]:
    """Every key of `data` that is no field of the SDK model class at its place (the SDK itself
    keeps unknown keys silently, and ARM ignores many of them: a misspelt field is lost)."""
    from azure.mgmt.compute._utils.model_base import Model

    if not isinstance(data, dict):
        return []
    inst = model(data)
    fields = {f._rest_name: attr for attr, f in inst._attr_to_rest_field.items()}
    bad = []
    for key in data:
        if key not in fields:
            bad.append(f"{where}.{key}")
            continue
        value = getattr(inst, fields[key])
        items = value if isinstance(value, list) else [value]
        raw = data[key] if isinstance(data[key], list) else [data[key]]
        for item, sub in zip(items, raw, strict=False):
            if isinstance(item, Model) or hasattr(item, "_attr_to_rest_field"):
                bad += unknown_keys(type(item), sub, f"{where}.{key}")
    return bad


def bodies(arm: FakeArm, pattern: str) -> list[dict[str, Any]]:
    """The recorded PUT bodies whose path ends in `pattern` (regex), in the order they were sent."""
    with arm.lock:
        return [b for p, b in arm.bodies if re.search(pattern + r"$", p, re.IGNORECASE)]


def check_models(arm: FakeArm) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The VM, NIC and availability-set bodies, each read against its SDK model."""
    from azure.mgmt.compute.models import AvailabilitySet, SecurityTypes, VirtualMachine
    from azure.mgmt.network.models import NetworkInterface

    vms = bodies(arm, r"/virtualMachines/node-\d+")
    nics = bodies(arm, r"/networkInterfaces/nic-\d+")
    avsets = bodies(arm, r"/availabilitySets/[^/]+")
    for body in vms:
        assert unknown_keys(VirtualMachine, body) == []
        assert body["properties"]["securityProfile"]["securityType"] in {t.value for t in SecurityTypes}
    for body in nics:
        assert unknown_keys(NetworkInterface, body) == []
    for body in avsets:
        assert unknown_keys(AvailabilitySet, body) == []
    return vms, nics, avsets


def test_the_model_check_finds_a_misspelt_field() -> None:
    from azure.mgmt.compute.models import VirtualMachine

    good = {"location": "eastus", "properties": {"securityProfile": {"uefiSettings": {"secureBootEnabled": False}}}}
    assert unknown_keys(VirtualMachine, good) == []
    bad = {"location": "eastus", "properties": {"securityProfile": {"uefiSettings": {"secureBoot": False}}}}
    assert unknown_keys(VirtualMachine, bad) == [".properties.securityProfile.uefiSettings.secureBoot"]
    nested = {"properties": {"networkProfile": {"networkInterfaces": [{"id": "x", "propertes": {}}]}}}
    assert unknown_keys(VirtualMachine, nested) == [".properties.networkProfile.networkInterfaces.propertes"]


def test_two_nd96asr_nodes_share_an_availability_set_with_accelerated_nics(
    arm: FakeArm, provider: AzureProvider, journal: Any
) -> None:
    req = launch_request("run-ib", gpu="A100:8", nodes=2, instance_type="Standard_ND96asr_v4")
    handle = provider.provision(req, journal)
    vms, nics, avsets = check_models(arm)
    assert len(vms) == 2 and len(nics) == 2 and len(avsets) == 1
    (avset,) = avsets
    assert avset["sku"] == {"name": "Aligned"} and avset["tags"]["gpucloud-run"] == "run-ib"
    assert avset["properties"]["platformFaultDomainCount"] == 1
    ppg = {vm["properties"]["proximityPlacementGroup"]["id"] for vm in vms}
    sets = {vm["properties"]["availabilitySet"]["id"] for vm in vms}
    assert len(ppg) == 1 and len(sets) == 1
    assert next(iter(sets)).lower().endswith("/providers/microsoft.compute/availabilitysets/avset")
    assert avset["properties"]["proximityPlacementGroup"]["id"] == next(iter(ppg))
    assert all(nic["properties"]["enableAcceleratedNetworking"] is True for nic in nics)
    # NDasrA100_v4: Trusted Launch "currently not supported" (trusted-launch.md): Standard, explicitly.
    assert all(vm["properties"]["securityProfile"] == {"securityType": "Standard"} for vm in vms)
    kinds = {r.kind for r in journal.resources("run-ib", alive_only=True)}
    assert "availability_set" in kinds  # journalled like every other resource

    assert any(r["type"].lower() == "microsoft.compute/availabilitysets" for r in run_resources(arm, "run-ib"))
    provider.teardown(handle, journal)
    assert run_resources(arm, "run-ib") == [], "the availability set goes with the resource group"
    assert not journal.resources("run-ib", alive_only=True)


def test_one_t4_node_gets_trusted_launch_without_secure_boot_and_no_availability_set(
    arm: FakeArm, provider: AzureProvider, journal: Any
) -> None:
    provider.provision(launch_request("run-t4", instance_type="Standard_NC4as_T4_v3"), journal)
    vms, nics, avsets = check_models(arm)
    assert avsets == [] and bodies(arm, r"/proximityPlacementGroups/[^/]+") == []
    (vm,) = vms
    assert "availabilitySet" not in vm["properties"]
    assert vm["properties"]["securityProfile"] == {
        "securityType": "TrustedLaunch",
        "uefiSettings": {"secureBootEnabled": False, "vTpmEnabled": True},
    }
    assert vm["properties"]["storageProfile"]["imageReference"]["sku"].endswith("gen2")
    (nic,) = nics
    assert nic["properties"]["enableAcceleratedNetworking"] is True


def test_spot_nodes_stay_out_of_availability_sets(arm: FakeArm, provider: AzureProvider, journal: Any) -> None:
    """ARM refuses spot VMs in an availability set; the fake does too."""
    req = launch_request("run-sib", gpu="A100:8", nodes=2, spot=True, instance_type="Standard_ND96asr_v4")
    provider.provision(req, journal)
    vms, _nics, avsets = check_models(arm)
    assert avsets == [] and all("availabilitySet" not in vm["properties"] for vm in vms)
    assert all(vm["properties"]["priority"] == "Spot" for vm in vms)
    assert fabric("Standard_ND96asr_v4", spot=True) == ACCELERATED


def test_gc_deletes_an_expired_runs_availability_set(arm: FakeArm, provider: AzureProvider, journal: Any) -> None:
    req = launch_request(
        "run-gcib", gpu="A100:8", nodes=2, instance_type="Standard_ND96asr_v4", expires_in=timedelta(minutes=-5)
    )
    provider.provision(req, journal)
    assert any(r["type"].lower() == "microsoft.compute/availabilitysets" for r in run_resources(arm, "run-gcib"))
    done = provider.gc(datetime.now(UTC), dry_run=False)
    assert len(done) == 1 and done[0].startswith("deleted")
    assert run_resources(arm, "run-gcib") == []


def test_ncv3_nic_has_no_accelerated_networking_and_the_fake_refuses_one(
    arm: FakeArm, provider: AzureProvider, journal: Any
) -> None:
    req = launch_request("run-v100", instance_type="Standard_NC6s_v3")  # NCv3 (retired; the plan no longer offers it)
    provider.provision(req, journal)
    _vms, (nic,), _ = check_models(arm)
    assert nic["properties"]["enableAcceleratedNetworking"] is False
    # The fake is as strict as ARM: the same VM with an accelerated NIC is refused.
    from azure.core.exceptions import HttpResponseError

    rg = run_resources(arm, "run-v100")[0]["id"].split("/")[4]
    nic_body = {**nic, "properties": {**nic["properties"], "enableAcceleratedNetworking": True}}
    provider.network.network_interfaces.begin_create_or_update(rg, "nic-x", nic_body).result()
    vm = bodies(arm, r"/virtualMachines/node-0")[0]
    nic_id = (
        f"/subscriptions/{arm.subscription_id}/resourceGroups/{rg}/providers/Microsoft.Network/networkInterfaces/nic-x"
    )
    vm["properties"]["networkProfile"]["networkInterfaces"][0]["id"] = nic_id
    vm["properties"]["osProfile"]["computerName"] = "x"
    with pytest.raises(HttpResponseError, match="VMSizeIsNotPermittedToEnableAcceleratedNetworking"):
        provider.compute.virtual_machines.begin_create_or_update(rg, "node-x", vm).result()


@pytest.mark.parametrize(
    ("size", "gpu", "image", "expected"),
    [
        ("Standard_NC4as_T4_v3", "T4", "", "TrustedLaunch"),
        ("Standard_NV36ads_A10_v5", "A10", "", "TrustedLaunch"),  # GRID: the extension needs Secure Boot off
        ("Standard_ND96isr_H100_v5", "H100", "", "TrustedLaunch"),
        ("Standard_ND96asr_v4", "A100", "", "Standard"),  # NDasrA100_v4: not yet
        ("Standard_ND96amsr_A100_v4", "A100", "", "Standard"),  # NDm_A100_v4: not yet
        ("Standard_NC6", "K80", "", "Standard"),  # NC v1: Gen1 only
        ("Standard_NC24r", "K80", "", "Standard"),
        (
            "Standard_NC4as_T4_v3",
            "T4",
            "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/images/i",
            "Standard",
        ),
        ("Standard_NC4as_T4_v3", "T4", "Canonical:0001-com-ubuntu-server-jammy:22_04-lts:latest", "Standard"),
        ("Standard_NC4as_T4_v3", "T4", "Canonical:ubuntu-24_04-lts:server:latest", "TrustedLaunch"),
        ("Standard_NC4as_T4_v3", "T4", "microsoft-dsvm:ubuntu-hpc:2204:latest", "Standard"),
    ],
)
def test_security_type_per_size_and_image(size: str, gpu: str, image: str, expected: str) -> None:
    req = launch_request("run-sec", instance_type=size)
    req = dataclasses.replace(req, gpu=gpu, image_ref=image, image=None)
    body = vm_body(req, 0, "#!/bin/bash\n", "/nic", "eastus", {}, "ssh-ed25519 AAAA")
    assert body["properties"]["securityProfile"]["securityType"] == expected
    if expected == "TrustedLaunch":
        assert body["properties"]["securityProfile"]["uefiSettings"]["secureBootEnabled"] is False


@pytest.mark.parametrize(
    ("size", "accelerated", "net"),
    [
        ("Standard_NC4as_T4_v3", True, ACCELERATED),
        ("Standard_NC24ads_A100_v4", True, ACCELERATED),
        ("Standard_NC40ads_H100_v5", True, ACCELERATED),
        ("Standard_NC80adis_H100_v5", True, ACCELERATED),
        ("Standard_NV12s_v3", True, ACCELERATED),
        ("Standard_NV36adms_A10_v5", True, ACCELERATED),
        ("Standard_NC6s_v3", False, TCP),
        ("Standard_NC6", False, TCP),
        ("Standard_ND40rs_v2", True, INFINIBAND),
        ("Standard_ND96asr_v4", True, INFINIBAND),
        ("Standard_ND96amsr_A100_v4", True, INFINIBAND),
        ("Standard_ND96isr_H100_v5", True, INFINIBAND),
        ("Standard_ND96isr_H200_v5", True, INFINIBAND),
        ("Standard_Unknown_v9", False, TCP),
    ],
)
def test_size_tables(size: str, accelerated: bool, net: str) -> None:
    assert accelerated_networking(size) is accelerated
    assert fabric(size) == net
    assert security_type(size, False, {"sku": "22_04-lts-gen2"}) in {"TrustedLaunch", "Standard"}


def test_an_image_builder_vm_boots_standard() -> None:
    """A builder is captured as a managed image, which Trusted Launch does not support (the fake ARM
    refuses the capture, as ARM does: test_images_azure_e2e.py); its name marks it."""
    from gpucloud.providers.azure.sizes import BUILDER_NAME_PREFIX
    from gpucloud.run.bake import builder_spec, gpu_spec

    spec = builder_spec(gpu_spec("T4", None, "azure"), with_setup=False, empty_dir="/tmp")
    assert spec.name.startswith(BUILDER_NAME_PREFIX)
    req = dataclasses.replace(launch_request("run-bake", instance_type="Standard_NC4as_T4_v3"), job_name=spec.name)
    body = vm_body(req, 0, "#!/bin/bash\n", "/nic", "eastus", {}, "ssh-ed25519 AAAA")
    assert body["properties"]["securityProfile"] == {"securityType": "Standard"}


def test_the_fake_refuses_trusted_launch_where_arm_does(arm: FakeArm, provider: AzureProvider, journal: Any) -> None:
    """What makes the security table matter: ND96asr_v4 (and Gen1 images) under Trusted Launch are refused."""
    from azure.core.exceptions import HttpResponseError

    req = launch_request("run-tl", instance_type="Standard_ND96asr_v4")
    provider.provision(req, journal)
    (vm,) = bodies(arm, r"/virtualMachines/node-0")
    rg = run_resources(arm, "run-tl")[0]["id"].split("/")[4]
    vm["properties"]["securityProfile"] = {
        "securityType": "TrustedLaunch",
        "uefiSettings": {"secureBootEnabled": False, "vTpmEnabled": True},
    }
    with pytest.raises(HttpResponseError, match="TrustedLaunch"):
        provider.compute.virtual_machines.begin_create_or_update(rg, "node-0", vm).result()
