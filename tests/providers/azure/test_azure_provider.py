"""AzureProvider and BlobChannel against the fake ARM server (and Azurite): what gets created, with
which properties and tags, how Azure's errors are classified, teardown, gc, and the SAS URLs."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpucloud.contract.provider import (
    CandidateError,
    CapacityError,
    FatalProvisionError,
    QuotaError,
    RunHandle,
    ThrottledError,
)
from gpucloud.providers.azure import (
    CONTRIBUTOR_ROLE_ID,
    AzureProvider,
    classify_error,
    image_reference,
    quota_family,
    resource_group_name,
)
from tests.support.azure_fixtures import (  # noqa: F401  (fixtures)
    OperatorCredential,
    arm,
    azurite,
    fake_arm_server,
    finish_failed_attempt,
    journal,
    launch_request,
    provider,
    run_resources,
    wait_until,
)
from tests.support.fake_arm import IDENTITY_HEADER, FakeArm

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def by_type(arm: FakeArm, run_id: str, rtype: str) -> list[dict[str, Any]]:
    with arm.lock:
        return [
            json.loads(json.dumps(r.body))
            for r in arm.resources.values()
            if r.type.lower() == rtype.lower() and f"gpucloud-{run_id}-" in r.id
        ]


def arm_call(arm: FakeArm, method: str, path: str, token: str) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(f"{arm.url}{path}", method=method, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            body = resp.read()
            return resp.status, json.loads(body) if body else {}
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return exc.code, json.loads(body) if body else {}


# ---- what provision creates -----------------------------------------------------------------------


def test_ssh_opens_port_22_from_the_caller_only_with_the_runs_own_key(
    arm: FakeArm, provider: AzureProvider, journal: Any, gpucloud_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCLOUD_SSH_CIDR", "203.0.113.7/32")
    handle = provider.provision(launch_request("run-ssh", extra="  ssh: true\n"), journal)
    (nsg,) = by_type(arm, "run-ssh", "Microsoft.Network/networkSecurityGroups")
    allowed = [
        r["properties"]
        for r in nsg["properties"]["securityRules"]
        if r["properties"]["direction"] == "Inbound" and r["properties"]["access"] == "Allow"
    ]
    assert [(r["sourceAddressPrefix"], r["destinationPortRange"]) for r in allowed] == [("203.0.113.7/32", "22")]
    (vm,) = by_type(arm, "run-ssh", "Microsoft.Compute/virtualMachines")
    keys = vm["properties"]["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"]
    [private] = list((gpucloud_home / "keys").glob("gpucloud-run-ssh-*.key"))  # the run's own pair, not yours
    assert private.stat().st_mode & 0o777 == 0o600
    pub = subprocess.run(["ssh-keygen", "-y", "-f", str(private)], capture_output=True, text=True, check=True)
    assert [k["keyData"].split()[:2] for k in keys] == [pub.stdout.split()[:2]]
    provider.teardown(handle, journal)
    assert not private.exists()


def test_provision_creates_one_tagged_group_with_network_and_vm(
    arm: FakeArm, provider: AzureProvider, journal: Any
) -> None:
    req = launch_request("run-a")
    handle = provider.provision(req, journal)
    ids = handle.nodes
    rg = resource_group_name("run-a", "eastus")
    assert ids == [
        f"/subscriptions/{arm.subscription_id}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/node-0"
    ]

    everything = run_resources(arm, "run-a")
    kinds = sorted(r["type"] for r in everything)
    assert kinds == sorted(
        [
            "Microsoft.Resources/resourceGroups",
            "Microsoft.Network/networkSecurityGroups",
            "Microsoft.Network/virtualNetworks",
            "Microsoft.Network/virtualNetworks/subnets",
            "Microsoft.Network/publicIPAddresses",
            "Microsoft.Network/networkInterfaces",
            "Microsoft.Compute/virtualMachines",
            "Microsoft.Authorization/roleAssignments",
        ]
    )
    for res in everything:
        if res["type"].endswith(("/subnets", "/roleAssignments")):
            continue  # no tags of their own in ARM
        assert res["tags"]["gpucloud-run"] == "run-a", res["id"]
        assert res["tags"]["gpucloud-expires"] == req.tags["gpucloud-expires"], res["id"]
        assert res["tags"]["Name"] == "gpucloud-run-a"
        assert res["state"] == "Succeeded"

    (nsg,) = by_type(arm, "run-a", "Microsoft.Network/networkSecurityGroups")
    inbound = [r["properties"] for r in nsg["properties"]["securityRules"] if r["properties"]["direction"] == "Inbound"]
    assert not [r for r in inbound if r["access"] == "Allow"], "no inbound allow rule for a single-node job without ssh"
    assert any(r["access"] == "Deny" and r["sourceAddressPrefix"] == "*" for r in inbound)

    (pip,) = by_type(arm, "run-a", "Microsoft.Network/publicIPAddresses")
    assert pip["sku"]["name"] == "Standard" and pip["properties"]["publicIPAllocationMethod"] == "Static"
    (vnet,) = by_type(arm, "run-a", "Microsoft.Network/virtualNetworks")
    assert vnet["properties"]["subnets"][0]["properties"]["networkSecurityGroup"]["id"] == nsg["id"]
    (nic,) = by_type(arm, "run-a", "Microsoft.Network/networkInterfaces")
    assert nic["properties"]["ipConfigurations"][0]["properties"]["publicIPAddress"]["id"] == pip["id"]

    (vm,) = by_type(arm, "run-a", "Microsoft.Compute/virtualMachines")
    props = vm["properties"]
    assert props["hardwareProfile"]["vmSize"] == "Standard_NC4as_T4_v3"
    assert props["storageProfile"]["osDisk"]["diskSizeGB"] == 100
    # the plan's image: Canonical's Ubuntu (Azure's HPC image is documented for ND sizes only, not NC T4)
    assert props["storageProfile"]["imageReference"] == {
        "publisher": "Canonical",
        "offer": "0001-com-ubuntu-server-jammy",
        "sku": "22_04-lts-gen2",
        "version": "latest",
    }
    assert props["osProfile"]["linuxConfiguration"]["disablePasswordAuthentication"] is True
    assert "priority" not in props and "billingProfile" not in props
    assert vm["identity"]["type"] == "SystemAssigned"
    assert arm.custom_data(vm["id"]) == req.user_data[0]

    (role,) = by_type(arm, "run-a", "Microsoft.Authorization/roleAssignments")
    assert role["properties"]["scope"] == f"/subscriptions/{arm.subscription_id}/resourceGroups/{rg}"
    assert role["properties"]["principalId"] == vm["identity"]["principalId"]
    assert role["properties"]["roleDefinitionId"].endswith(f"/roleDefinitions/{CONTRIBUTOR_ROLE_ID}")

    recorded = {(r.kind, r.status) for r in journal.resources("run-a")}
    assert ("resource_group", "created") in recorded and ("vm", "created") in recorded
    assert ("role_assignment", "created") in recorded


@pytest.mark.parametrize("max_price,expected", [(None, -1), ("  max_price_per_hour: 0.6\n", 0.6)])
def test_spot_vm_has_priority_eviction_delete_and_max_price(
    arm: FakeArm, provider: AzureProvider, journal: Any, max_price: str | None, expected: float
) -> None:
    provider.provision(launch_request("run-spot", spot=True, extra=max_price or ""), journal)
    (vm,) = by_type(arm, "run-spot", "Microsoft.Compute/virtualMachines")
    assert vm["properties"]["priority"] == "Spot"
    assert vm["properties"]["evictionPolicy"] == "Delete"
    assert vm["properties"]["billingProfile"]["maxPrice"] == expected


def test_multi_node_gets_a_vm_and_role_per_node_and_subnet_only_inbound(
    arm: FakeArm, provider: AzureProvider, journal: Any
) -> None:
    req = launch_request("run-mn", nodes=2)
    handle = provider.provision(req, journal)
    ids = handle.nodes
    assert [i.rsplit("/", 1)[1] for i in ids] == ["node-0", "node-1"]
    vms = by_type(arm, "run-mn", "Microsoft.Compute/virtualMachines")
    roles = by_type(arm, "run-mn", "Microsoft.Authorization/roleAssignments")
    assert {r["properties"]["principalId"] for r in roles} == {v["identity"]["principalId"] for v in vms}
    assert [arm.custom_data(v["id"]) for v in sorted(vms, key=lambda v: v["name"])] == req.user_data
    (nsg,) = by_type(arm, "run-mn", "Microsoft.Network/networkSecurityGroups")
    allows = [r["properties"] for r in nsg["properties"]["securityRules"] if r["properties"]["access"] == "Allow"]
    assert allows and all(r["sourceAddressPrefix"] == r["destinationAddressPrefix"] == "10.0.0.0/24" for r in allows)
    assert provider.node_states(handle) == ["running", "running"]


def test_image_gen1_for_nc_k80_sizes_gen2_elsewhere_and_image_wins() -> None:
    from gpucloud.errors import UserError

    assert image_reference("auto", "20.04", "Standard_NC6", "K80")["sku"] == "20_04-lts"
    assert image_reference("auto", "20.04", "Standard_NC24r", "K80")["sku"] == "20_04-lts"
    assert image_reference("auto", "20.04", "Standard_NC6s_v3", "V100")["sku"] == "20_04-lts-gen2"
    assert image_reference("auto", "22.04", "Standard_NC24ads_A100_v4", "A100-80GB")["sku"] == "22_04-lts-gen2"
    assert image_reference("auto", "24.04", "Standard_NC4as_T4_v3", "T4") == {
        "publisher": "Canonical",
        "offer": "ubuntu-24_04-lts",
        "sku": "server",
        "version": "latest",
    }
    assert (
        image_reference(
            "Canonical:0001-com-ubuntu-server-focal:20_04-lts:20.04.202301010", "22.04", "Standard_NC4as_T4_v3", "T4"
        )["version"]
        == "20.04.202301010"
    )
    gallery = "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/galleries/x/images/y/versions/1.0.0"
    assert image_reference(gallery, "22.04", "Standard_NC4as_T4_v3", "T4") == {"id": gallery}
    with pytest.raises(UserError, match="URN"):
        image_reference("ubuntu-latest", "22.04", "Standard_NC4as_T4_v3", "T4")


def test_k80_request_on_nc6_uses_the_gen1_image(arm: FakeArm, provider: AzureProvider, journal: Any) -> None:
    # The planner refuses retired NC sizes; a caller naming one still gets the right image generation.
    from gpucloud.plan.stacks import resolve_stack

    req = launch_request("run-k80", instance_type="Standard_NC6")
    req.ubuntu = resolve_stack("K80").ubuntu_version
    req.gpu = "K80"
    provider.provision(req, journal)
    (vm,) = by_type(arm, "run-k80", "Microsoft.Compute/virtualMachines")
    assert vm["properties"]["storageProfile"]["imageReference"]["sku"] == "20_04-lts"
    assert vm["properties"]["storageProfile"]["imageReference"]["offer"] == "0001-com-ubuntu-server-focal"


def test_custom_data_over_64_kb_is_refused_before_any_call(arm: FakeArm, provider: AzureProvider, journal: Any) -> None:
    with pytest.raises(FatalProvisionError, match="64 KB"):
        provider.provision(launch_request("run-big", user_data=["#" * 50_000]), journal)
    assert not arm.calls


# ---- error classification --------------------------------------------------------------------------

VM_PUT = r"/virtualMachines/node-0$"
QUOTA_MSG = (
    "Operation could not be completed as it results in exceeding approved standardNCASv3_T4Family Cores "
    "quota. Additional details - Deployment Model: Resource Manager, Location: eastus, Current Limit: 0"
)


@pytest.mark.parametrize(
    "code,async_,message,kind,quota",
    [
        ("AllocationFailed", True, "Allocation failed.", CapacityError, None),
        ("ZonalAllocationFailed", True, "Allocation failed in zone 1.", CapacityError, None),
        ("OverconstrainedAllocationRequest", True, "Allocation failed: constraints.", CapacityError, None),
        (
            "SkuNotAvailable",
            False,
            "The requested size is currently not available (NotAvailableForSubscription).",
            CapacityError,
            None,
        ),
        ("OperationNotAllowed", False, QUOTA_MSG, QuotaError, "Standard NCASv3_T4 Family vCPUs"),
        (
            "QuotaExceeded",
            False,
            "Quota exceeded for Standard NCASv3_T4 Family vCPUs in eastus.",
            QuotaError,
            "Standard NCASv3_T4 Family vCPUs",
        ),
        (
            "OperationNotAllowed",
            False,
            "exceeding approved LowPriorityCores quota",
            QuotaError,
            "Total Regional Spot vCPUs (LowPriorityCores)",
        ),
        ("TooManyRequests", False, "Throttled.", ThrottledError, None),
        ("InternalServerError", False, "Boom.", ThrottledError, None),
        ("InvalidParameter", False, "Bad parameter.", CandidateError, None),
        (
            "AzureSpotIsNotSupportedForThisVMSize",
            False,
            "Spot is not supported for this VM size.",
            CandidateError,
            None,
        ),
    ],
)
def test_vm_errors_are_classified_and_the_attempt_cleaned_up(
    arm: FakeArm,
    provider: AzureProvider,
    journal: Any,
    code: str,
    async_: bool,
    message: str,
    kind: type,
    quota: str | None,
) -> None:
    arm.inject("PUT", VM_PUT, code, message=message, async_=async_, times=100)
    with pytest.raises(kind) as info:
        provider.provision(launch_request("run-err"), journal)
    err = info.value
    assert err.code == code
    if quota:
        assert err.quota_code == quota and quota in err.message
    assert "Traceback" not in err.render()
    finish_failed_attempt(arm, provider, journal, "run-err")


def test_a_failed_attempt_does_not_wait_for_its_group_to_go(
    arm: FakeArm, provider: AzureProvider, journal: Any
) -> None:
    arm.inject("PUT", VM_PUT, "AllocationFailed", times=100)
    arm.inject("DELETE", r"/resourcegroups/gpucloud-run-slow-", code=None, op_seconds=4.0)  # minutes on Azure
    t0 = time.monotonic()
    with pytest.raises(CapacityError):
        provider.provision(launch_request("run-slow"), journal)
    assert time.monotonic() - t0 < 3.0, "the failed attempt waited for the group's deletion"
    [group] = [r for r in run_resources(arm, "run-slow") if r["type"] == "Microsoft.Resources/resourceGroups"]
    assert group["state"] == "Deleting"
    assert [r.kind for r in journal.resources("run-slow", alive_only=True) if r.kind == "resource_group"]
    # The next attempt in the same region gets its own group: no ResourceGroupBeingDeleted.
    arm.clear_injections()
    handle = provider.provision(dataclasses.replace(launch_request("run-slow"), attempt=1), journal)
    assert handle.resources["resource-group"] == [resource_group_name("run-slow", "eastus", 1)]
    provider.teardown(handle, journal, wait=True)  # the run's teardown also finishes the first group
    assert run_resources(arm, "run-slow") == []
    assert not journal.resources("run-slow", alive_only=True)


def test_throttling_is_retried_with_backoff_then_succeeds(arm: FakeArm, provider: AzureProvider, journal: Any) -> None:
    inj = arm.inject("PUT", r"/networkSecurityGroups/nsg$", "TooManyRequests", times=2)
    handle = provider.provision(launch_request("run-429"), journal)
    assert inj.hits == 2
    assert provider.node_states(handle) == ["running"]


def test_role_assignment_waits_for_the_new_identity(arm: FakeArm, provider: AzureProvider, journal: Any) -> None:
    inj = arm.inject("PUT", r"/roleAssignments/", "PrincipalNotFound", times=1)
    provider.provision(launch_request("run-pnf"), journal)
    assert inj.hits == 1
    assert len(by_type(arm, "run-pnf", "Microsoft.Authorization/roleAssignments")) == 1


def test_missing_right_to_assign_roles_is_fatal_with_a_hint(
    arm: FakeArm, provider: AzureProvider, journal: Any
) -> None:
    role = arm.operator_role or {}
    action = "Microsoft.Authorization/roleAssignments/write"
    assert action in role["actions"]  # the printed role has it; this one lacks it
    arm.operator_role = {**role, "actions": [a for a in role["actions"] if a != action]}
    with pytest.raises(FatalProvisionError) as info:
        provider.provision(launch_request("run-auth"), journal)
    assert action in info.value.message
    assert "gpucloud iam-policy azure" in (info.value.hint or "")
    arm.operator_role = role
    finish_failed_attempt(arm, provider, journal, "run-auth")


def test_classify_error_without_a_server() -> None:
    from azure.core.exceptions import ClientAuthenticationError, ServiceRequestError

    from gpucloud.errors import CredentialsError, EndpointError

    # A cloud that cannot be used at all is its own class (skip the cloud, exit 78), not "fatal".
    assert isinstance(classify_error(ServiceRequestError("connection refused"), where="x"), EndpointError)
    err = classify_error(ClientAuthenticationError("DefaultAzureCredential failed"), where="x")
    assert isinstance(err, CredentialsError) and "az login" in (err.hint or "")
    assert quota_family("exceeding approved Cores quota", "Standard_NC4as_T4_v3") == "Total Regional vCPUs"


# ---- state, teardown, gc ---------------------------------------------------------------------------


def test_node_states_follow_the_instance_view(arm: FakeArm, provider: AzureProvider, journal: Any) -> None:
    handle = provider.provision(launch_request("run-st"), journal)
    (vm_id,) = handle.nodes
    assert handle.resources == {"resource-group": [resource_group_name("run-st", "eastus")], "vm": ["node-0"]}
    assert provider.node_states(handle) == ["running"]
    arm.set_power_state(vm_id, "stopped")  # a shutdown inside the guest: still allocated
    assert provider.node_states(handle) == ["stopping"]
    fresh = AzureProvider(credential=OperatorCredential(arm), subscription_id=arm.subscription_id, arm_endpoint=arm.url)
    stored = RunHandle.from_json(handle.to_json())  # another CLI process reads the handle from the state store
    assert fresh.node_states(stored) == ["stopping"]
    partial = RunHandle("run-st", "azure", "eastus", complete=False)  # a crash before provision returned
    assert fresh.node_states(partial) == ["stopping"]
    provider.teardown(handle, journal)
    assert provider.node_states(handle) == ["gone"]
    assert fresh.node_states(stored) == ["gone"]


def test_teardown_deletes_the_group_and_is_idempotent(arm: FakeArm, provider: AzureProvider, journal: Any) -> None:
    handle = provider.provision(launch_request("run-td"), journal)
    provider.teardown(handle, journal)
    assert run_resources(arm, "run-td") == []
    assert not journal.resources("run-td", alive_only=True)
    provider.teardown(handle, journal)  # already gone: 404 is done
    provider.teardown(RunHandle("never-ran", "azure", "westus2", complete=False), journal)  # nothing ever created
    provider.teardown(RunHandle("never-ran", "azure", "westus2"), journal)  # an empty handle: no call at all
    deletes = [c for c in arm.calls if c[0] == "DELETE"]
    assert len(deletes) == 3


def test_teardown_without_wait_returns_at_once(arm: FakeArm, provider: AzureProvider, journal: Any) -> None:
    handle = provider.provision(launch_request("run-nw"), journal)
    arm.op_seconds = 2.0  # the deletion takes 2 s on the server
    try:
        t0 = time.monotonic()
        provider.teardown(handle, journal, wait=False)
        assert time.monotonic() - t0 < 1.5
        assert any(r["state"] == "Deleting" for r in run_resources(arm, "run-nw"))
        assert wait_until(lambda: run_resources(arm, "run-nw") == [], timeout=5)
    finally:
        arm.op_seconds = 0.02


def test_gc_deletes_only_expired_groups(arm: FakeArm, provider: AzureProvider, journal: Any) -> None:
    provider.provision(launch_request("run-old", expires_in=timedelta(minutes=-5)), journal)
    provider.provision(launch_request("run-new"), journal)
    provider.resource.resource_groups.create_or_update("unrelated", {"location": "eastus", "tags": {"team": "x"}})
    now = datetime.now(UTC)
    dry = provider.gc(now, dry_run=True)
    assert len(dry) == 1 and "would delete" in dry[0] and "run-old" in dry[0]
    assert run_resources(arm, "run-old")
    done = provider.gc(now, dry_run=False)
    assert len(done) == 1 and done[0].startswith("deleted") and "run-old" in done[0]
    assert run_resources(arm, "run-old") == []
    assert run_resources(arm, "run-new")
    assert any(r["id"].endswith("/unrelated") for r in arm.snapshot())
    assert provider.gc(now, dry_run=False) == []


# ---- the VM's managed identity ---------------------------------------------------------------------


def test_vm_identity_may_delete_its_own_group_and_nothing_else(
    arm: FakeArm, provider: AzureProvider, journal: Any
) -> None:
    provider.provision(launch_request("run-mi1"), journal)
    provider.provision(launch_request("run-mi2"), journal)
    (vm,) = by_type(arm, "run-mi1", "Microsoft.Compute/virtualMachines")
    imds = arm.imds_endpoint(vm["identity"]["principalId"])
    req = urllib.request.Request(
        f"{imds}/metadata/identity/oauth2/token?api-version=2018-02-01&resource={arm.url}/",
        headers={"Metadata": "true"},
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        token = json.loads(resp.read())["access_token"]
    req = urllib.request.Request(
        f"{imds}/metadata/instance/compute?api-version=2021-02-01", headers={"Metadata": "true"}
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        compute = json.loads(resp.read())
    assert compute["resourceGroupName"] == resource_group_name("run-mi1", "eastus")
    sub = arm.subscription_id
    other = resource_group_name("run-mi2", "eastus")
    status, body = arm_call(arm, "DELETE", f"/subscriptions/{sub}/resourcegroups/{other}?api-version=2021-04-01", token)
    assert status == 403 and body["error"]["code"] == "AuthorizationFailed"
    own = compute["resourceGroupName"]
    public = urllib.request.Request(  # another cloud's audience: ARM refuses the token
        f"{imds}/metadata/identity/oauth2/token?api-version=2018-02-01&resource=https://management.azure.com/",
        headers={"Metadata": "true"},
    )
    with urllib.request.urlopen(public, timeout=5) as resp:
        wrong = json.loads(resp.read())["access_token"]
    status, body = arm_call(arm, "DELETE", f"/subscriptions/{sub}/resourcegroups/{own}?api-version=2021-04-01", wrong)
    assert status == 401 and body["error"]["code"] == "InvalidAuthenticationTokenAudience"
    status, _ = arm_call(arm, "DELETE", f"/subscriptions/{sub}/resourcegroups/{own}?api-version=2021-04-01", token)
    assert status == 202
    assert wait_until(lambda: run_resources(arm, "run-mi1") == [])
    assert run_resources(arm, "run-mi2")


def test_default_credential_reaches_the_fake_through_the_environment(arm: FakeArm, journal: Any) -> None:
    # What the CLI subprocess does: DefaultAzureCredential, AZURE_SUBSCRIPTION_ID, the endpoint setting.
    provider = AzureProvider()
    handle = provider.provision(launch_request("run-env"), journal)
    provider.teardown(handle, journal)
    assert run_resources(arm, "run-env") == []


def test_fake_arm_runs_standalone() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_arm", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        url = line.strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(f"{url}/_fake/snapshot", timeout=5) as resp:
            assert json.loads(resp.read()) == []
        req = urllib.request.Request(
            f"{url}/_identity?api-version=2019-08-01&resource=x", headers={"X-IDENTITY-HEADER": IDENTITY_HEADER}
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert json.loads(resp.read())["token_type"] == "Bearer"
    finally:
        proc.terminate()
        proc.wait(5)


# ---- Blob channel ----------------------------------------------------------------------------------


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["curl", "-sS", *args], capture_output=True, text=True, timeout=30)


def test_blob_channel_creates_private_https_only_storage_once(
    arm: FakeArm, azurite: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCLOUD_AZURE_BLOB_ENDPOINT", azurite.blob_endpoint)
    channel = AzureProvider().channel("eastus")
    accounts = [r for r in arm.resources.values() if r.type == "Microsoft.Storage/storageAccounts"]
    assert len(accounts) == 1
    props = accounts[0].body["properties"]
    assert props["supportsHttpsTrafficOnly"] is True and props["allowBlobPublicAccess"] is False
    assert props["minimumTlsVersion"] == "TLS1_2"
    assert "gpucloud-expires" not in (accounts[0].body.get("tags") or {}), "gc must never sweep the channel store"
    assert channel.account_name == "devstoreaccount1"  # from the endpoint; the key came from listKeys
    puts = len([c for c in arm.calls if c[0] == "PUT"])
    AzureProvider().channel("eastus")  # a second CLI process reuses it
    assert len([c for c in arm.calls if c[0] == "PUT"]) == puts
    # Private container: no anonymous reads.
    channel.put_bytes("runs/p/x", b"secret")
    anonymous = curl("-o", "/dev/null", "-w", "%{http_code}", f"{channel.account_url}/{channel.container}/runs/p/x")
    assert anonymous.stdout in ("401", "403", "404")


def test_blob_sas_urls_work_with_curl_until_they_expire(
    arm: FakeArm, azurite: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPUCLOUD_AZURE_BLOB_ENDPOINT", azurite.blob_endpoint)
    channel = AzureProvider().channel("eastus")
    assert channel.put_headers == ("x-ms-blob-type: BlockBlob",)
    later = datetime.now(UTC) + timedelta(hours=1)
    channel.put_bytes("runs/s/code.tar.gz", b"code")
    get = channel.url_get("runs/s/code.tar.gz", later)
    assert curl("-f", get).stdout == "code"

    part = tmp_path / "part"
    part.write_text("log line\n")
    put = channel.url_put("runs/s/node-0/log/000000", later)
    res = curl("-f", "-T", str(part), "-H", channel.put_headers[0], put)
    assert res.returncode == 0, res.stderr
    assert channel.get_bytes("runs/s/node-0/log/000000") == b"log line\n"
    # Overwrite (status.json is PUT again and again).
    part.write_text("again\n")
    assert curl("-f", "-T", str(part), "-H", channel.put_headers[0], put).returncode == 0
    assert channel.get_bytes("runs/s/node-0/log/000000") == b"again\n"

    # A GET URL cannot write, a URL for one object cannot reach another, an expired one is refused.
    assert (
        curl("-o", "/dev/null", "-w", "%{http_code}", "-T", str(part), "-H", channel.put_headers[0], get).stdout
        == "403"
    )
    other = put.replace("log/000000", "log/000001")
    assert (
        curl("-o", "/dev/null", "-w", "%{http_code}", "-T", str(part), "-H", channel.put_headers[0], other).stdout
        == "403"
    )
    expired = channel.url_get("runs/s/code.tar.gz", datetime.now(UTC) - timedelta(minutes=1))
    assert curl("-o", "/dev/null", "-w", "%{http_code}", expired).stdout == "403"

    # The run-level protocol on top: manifests hold working URLs.
    urls = channel.prepare("s", 1, datetime.now(UTC) + timedelta(minutes=30))
    manifest = curl("-f", urls[0]).stdout
    assert "code_get " in manifest and "status_put " in manifest
    code_url = next(line.split(" ", 1)[1] for line in manifest.splitlines() if line.startswith("code_get "))
    assert curl("-f", code_url).stdout == "code"
    channel.delete_prefix("runs/s/")
    assert channel.get_bytes("runs/s/code.tar.gz") is None
    assert channel.get_bytes("never/there") is None


def test_existing_public_storage_account_is_refused_and_sas_is_capped(
    arm: FakeArm, azurite: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from urllib.parse import parse_qs, urlsplit

    from gpucloud.errors import UserError
    from gpucloud.providers.azure.channel import MAX_SAS

    monkeypatch.setenv("GPUCLOUD_AZURE_BLOB_ENDPOINT", azurite.blob_endpoint)
    channel = AzureProvider().channel("eastus")
    far = datetime.now(UTC) + timedelta(days=30)
    expiry = parse_qs(urlsplit(channel.url_get("runs/c/x", far)).query)["se"][0]
    assert datetime.fromisoformat(expiry.replace("Z", "+00:00")) <= datetime.now(UTC) + MAX_SAS
    account = next(r for r in arm.resources.values() if r.type == "Microsoft.Storage/storageAccounts")
    account.body["properties"]["allowBlobPublicAccess"] = True  # someone opened it by hand
    with pytest.raises(UserError, match="allows public blob access") as info:
        AzureProvider().channel("eastus")
    assert "--allow-blob-public-access false" in (info.value.hint or "")


# ---- a dead endpoint fails fast ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_dead_arm_endpoint_fails_within_20_seconds(kind: str) -> None:
    """An ARM endpoint that refuses connections, or accepts and never answers, costs seconds, not
    minutes: bounded azure-core retries and timeouts (docs/PROVIDERS.md, "Azure calls and retries")."""
    from datetime import UTC, datetime

    from azure.core.credentials import AccessToken

    from gpucloud.contract.provider import ProvisionError
    from gpucloud.errors import CloudAccessError
    from tests.support.dead_endpoint import dead_endpoint

    class StaticToken:
        def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
            return AccessToken("token", int(time.time()) + 3600)

    with dead_endpoint(kind) as url:
        provider = AzureProvider(
            credential=StaticToken(), subscription_id="00000000-0000-0000-0000-000000000000", arm_endpoint=url
        )
        t0 = time.monotonic()
        with pytest.raises((ProvisionError, CloudAccessError)) as info:  # refused = EndpointError
            provider.gc(datetime.now(UTC), dry_run=True)
    assert time.monotonic() - t0 < 20
    assert isinstance(info.value, CloudAccessError)  # Azure unusable (78), not checked "in part" (75)
    if kind == "refused":
        assert url.split("//")[1] in info.value.message
    else:
        assert "did not answer" in info.value.message


def test_azure_declares_its_shape() -> None:
    """What the lifecycle and the renderer need is declared, not probed with getattr."""
    from gpucloud.contract.provider import Provider
    from gpucloud.contract.registry import get_provider

    provider = get_provider("azure")
    assert isinstance(provider, Provider)
    caps = provider.capabilities
    assert not caps.shared_user_data and caps.spot and caps.multi_node
    assert (caps.user_data_limit, caps.user_data_encoding, caps.self_termination) == (65536, "base64", "azure-delete")
    assert caps.preemption_notice == "azure-scheduled-events"
    assert provider.master_port() == 29500
    assert not hasattr(type(provider), "poll_interval")
    handle = RunHandle("r1", "azure", "westus2", resources={"resource-group": ["gpucloud-r1-westus2"]})
    assert "-g gpucloud-r1-westus2 -n node-1" in provider.console_hint(handle, 1)
    assert caps.console_hint.format(run_id="r1", region="westus2", rank=1) == provider.console_hint(handle, 1)
