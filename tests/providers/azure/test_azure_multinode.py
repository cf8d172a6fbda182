"""Multi-node runs on Azure, against the fake ARM server, Azurite and the VM simulator.

- Provider level: N nodes share one proximity placement group (created in the run's resource
  group, gone with it), their resources are created in parallel, the NSG lets the run's own subnet
  in and nothing else new, node_states answers N states in rank order, and a capacity error for
  any one node fails the whole attempt and leaves nothing behind.
- Lifecycle level: that capacity error moves both nodes to the next region together.
- End to end: examples/ddp-2-nodes.yaml on two simulated Azure VMs; the ranks meet at the barrier
  through Azurite and report the same final loss; nothing of the run remains.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpucloud.contract.provider import CapacityError, RunHandle
from gpucloud.providers.azure import SUBNET_PREFIX, AzureProvider, resource_group_name
from tests.support.azure_fixtures import (  # noqa: F401  (fixtures)
    arm,
    azure_env,
    azurite,
    fake_arm_server,
    finish_failed_attempt,
    journal,
    launch_request,
    leftovers,
    provider,
    run_resources,
    wait_until,
)
from tests.support.azure_sim import AzureVmSimulator, azure_sim  # noqa: F401
from tests.support.cli import cli
from tests.support.fake_arm import OPERATOR_PRINCIPAL, PPG_TYPE, VM_TYPE, FakeArm, Resource

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


def of_type(arm: FakeArm, run_id: str, rtype: str) -> list[dict[str, Any]]:
    """The run's resources of one type, as a GET answers them (a PPG lists its VMs)."""
    out = []
    for res in run_resources(arm, run_id):
        if res["type"].lower() == rtype.lower():
            token = arm.issue_token(OPERATOR_PRINCIPAL)
            req = urllib.request.Request(
                f"{arm.url}{res['id']}?api-version=2024-07-01", headers={"Authorization": f"Bearer {token}"}
            )
            with urllib.request.urlopen(req, timeout=5) as resp:
                out.append(json.loads(resp.read()))
    return sorted(out, key=lambda r: r["name"])


# ---- provider level --------------------------------------------------------------------------------


def test_nodes_share_a_placement_group_are_made_in_parallel_and_go_with_the_group(
    arm: FakeArm, provider: AzureProvider, journal: Any
) -> None:
    n = 4
    # ARM holds every VM creation until all n are in flight at once: made one after the other, the
    # first would wait out the 20 s and the most ever held together would be 1.
    stall = arm.inject("PUT", r"/virtualMachines/node-\d+$", None, delay=20.0, times=n, gather=n)
    handle = provider.provision(launch_request("run-ppg", nodes=n), journal)
    ids = handle.nodes
    assert handle.resources["vm"] == [f"node-{r}" for r in range(n)]
    assert [i.rsplit("/", 1)[1] for i in ids] == [f"node-{r}" for r in range(n)]  # rank order
    assert stall.most_at_once == n, f"the {n} VMs were not created in parallel ({stall.most_at_once} at once)"

    (ppg,) = of_type(arm, "run-ppg", "Microsoft.Compute/proximityPlacementGroups")
    rg = resource_group_name("run-ppg", "eastus")
    assert ppg["id"].lower().startswith(f"/subscriptions/{arm.subscription_id}/resourcegroups/{rg}/".lower())
    assert ppg["location"] == "eastus" and ppg["tags"]["gpucloud-run"] == "run-ppg"
    assert ppg["properties"]["proximityPlacementGroupType"] == "Standard"
    assert sorted(v["id"] for v in ppg["properties"]["virtualMachines"]) == sorted(ids)
    vms = of_type(arm, "run-ppg", "Microsoft.Compute/virtualMachines")
    assert {v["location"] for v in vms} == {"eastus"}
    assert all(v["properties"]["proximityPlacementGroup"]["id"] == ppg["id"] for v in vms)
    assert all(v["tags"]["gpucloud-run"] == "run-ppg" for v in vms)
    assert provider.node_states(handle) == ["running"] * n
    fresh = AzureProvider(credential=provider.credential(), subscription_id=arm.subscription_id, arm_endpoint=arm.url)
    assert (
        fresh.node_states(RunHandle("run-ppg", "azure", "eastus", complete=False)) == ["running"] * n
    )  # another CLI process counts the nodes

    # Shared resources once, per-node resources once per node.
    with arm.lock:
        puts = [p for m, p, _ in arm.calls if m == "PUT"]
    for kind, count in [
        ("resourcegroups/[^/]+", 1),
        ("networkSecurityGroups/", 1),
        ("virtualNetworks/", 1),
        ("proximityPlacementGroups/", 1),
        ("publicIPAddresses/", n),
        ("networkInterfaces/", n),
        ("virtualMachines/", n),
        ("roleAssignments/", n),
    ]:
        assert len([p for p in puts if re.search(kind + r"[^/]*$", p, re.I)]) == count, kind

    provider.teardown(handle, journal)
    assert run_resources(arm, "run-ppg") == [], "the placement group goes with the resource group"
    assert not journal.resources("run-ppg", alive_only=True)
    assert provider.node_states(handle) == ["gone"] * n


def test_single_node_needs_no_placement_group(arm: FakeArm, provider: AzureProvider, journal: Any) -> None:
    provider.provision(launch_request("run-one"), journal)
    assert of_type(arm, "run-one", "Microsoft.Compute/proximityPlacementGroups") == []
    (vm,) = of_type(arm, "run-one", "Microsoft.Compute/virtualMachines")
    assert "proximityPlacementGroup" not in vm["properties"]


def test_nsg_lets_the_runs_own_nodes_in_and_nothing_else(arm: FakeArm, provider: AzureProvider, journal: Any) -> None:
    provider.provision(launch_request("run-nsg", nodes=2), journal)
    (nsg,) = of_type(arm, "run-nsg", "Microsoft.Network/networkSecurityGroups")
    inbound = [r["properties"] for r in nsg["properties"]["securityRules"] if r["properties"]["direction"] == "Inbound"]
    allows = [r for r in inbound if r["access"] == "Allow"]
    assert len(allows) == 1, allows
    (allow,) = allows
    assert allow["sourceAddressPrefix"] == allow["destinationAddressPrefix"] == SUBNET_PREFIX
    assert allow["protocol"] == "*" and allow["destinationPortRange"] == "*"
    deny = [r for r in inbound if r["access"] == "Deny"]
    assert any(r["sourceAddressPrefix"] == "*" and r["destinationPortRange"] == "*" for r in deny)
    assert allow["priority"] < min(r["priority"] for r in deny)  # evaluated before the deny-all
    # The subnet is the run's own and holds only the run's NICs.
    (vnet,) = of_type(arm, "run-nsg", "Microsoft.Network/virtualNetworks")
    (subnet,) = vnet["properties"]["subnets"]
    assert subnet["properties"]["addressPrefix"] == SUBNET_PREFIX
    assert subnet["properties"]["networkSecurityGroup"]["id"] == nsg["id"]
    nics = of_type(arm, "run-nsg", "Microsoft.Network/networkInterfaces")
    assert len(nics) == 2
    assert all(
        ipc["properties"]["subnet"]["id"] == subnet["id"]
        for nic in nics
        for ipc in nic["properties"]["ipConfigurations"]
    )


@pytest.mark.parametrize("code", ["AllocationFailed", "OverconstrainedAllocationRequest"])
def test_capacity_error_on_node_1_fails_the_attempt_and_leaves_nothing(
    arm: FakeArm, provider: AzureProvider, journal: Any, code: str
) -> None:
    inj = arm.inject(
        "PUT",
        r"/virtualMachines/node-1$",
        code,
        async_=True,
        times=10,
        message="Allocation failed. We do not have sufficient capacity for the requested VM size.",
    )
    with pytest.raises(CapacityError) as info:
        provider.provision(launch_request("run-cap", nodes=3), journal)
    assert inj.hits == 1
    assert info.value.code == code and "eastus" in info.value.message
    finish_failed_attempt(arm, provider, journal, "run-cap")  # node 0 and 2, the placement group and the network go too


def test_fake_arm_placement_groups_speak_the_rest_shape(arm: FakeArm) -> None:
    """PUT is synchronous (201 with the body); a VM must name a placement group that exists in its
    own location."""
    token = arm.issue_token(OPERATOR_PRINCIPAL)

    def call(method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any], dict[str, str]]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{arm.url}{path}?api-version=2024-07-01",
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else {}, dict(resp.headers)
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, json.loads(raw) if raw else {}, dict(exc.headers)

    sub = f"/subscriptions/{arm.subscription_id}/resourceGroups/rg-ppg"
    assert call("PUT", sub, {"location": "eastus"})[0] == 201
    ppg_path = f"{sub}/providers/Microsoft.Compute/proximityPlacementGroups/ppg"
    status, doc, headers = call(
        "PUT", ppg_path, {"location": "eastus", "properties": {"proximityPlacementGroupType": "Standard"}}
    )
    assert status == 201 and "Azure-AsyncOperation" not in headers
    assert doc["type"] == "Microsoft.Compute/proximityPlacementGroups" and doc["id"] == ppg_path
    assert doc["properties"]["virtualMachines"] == []
    vm = {
        "location": "westus2",
        "properties": {
            "hardwareProfile": {"vmSize": "Standard_NC4as_T4_v3"},
            "proximityPlacementGroup": {"id": ppg_path},
        },
    }
    status, doc, _ = call("PUT", f"{sub}/providers/Microsoft.Compute/virtualMachines/vm", vm)
    assert status == 400 and "location" in doc["error"]["message"]
    vm["properties"]["proximityPlacementGroup"]["id"] = ppg_path + "-missing"
    status, doc, _ = call("PUT", f"{sub}/providers/Microsoft.Compute/virtualMachines/vm", vm)
    assert status == 400 and doc["error"]["code"] == "NotFound"
    assert call("DELETE", sub)[0] == 202
    assert wait_until(lambda: call("GET", ppg_path)[0] == 404)


# ---- lifecycle and end to end ------------------------------------------------------------------------


class VmWatch:
    """Records every VM the fake ARM finishes creating: (resource group, name, location, PPG id)."""

    def __init__(self, arm: FakeArm) -> None:
        self.arm = arm
        self.vms: list[tuple[str, str, str, str]] = []
        self._lock = threading.Lock()
        arm.on_event(self._on_event)

    def _on_event(self, event: str, res: Resource) -> None:
        if event == "vm_created" and res.type.lower() == VM_TYPE:
            ppg = ((res.body.get("properties") or {}).get("proximityPlacementGroup") or {}).get("id", "")
            with self._lock:
                self.vms.append((res.id.split("/")[4], res.id.rsplit("/", 1)[1], res.body.get("location", ""), ppg))

    def close(self) -> None:
        with self.arm.lock:
            self.arm.listeners.remove(self._on_event)


@pytest.fixture
def vm_watch(arm: FakeArm) -> Any:
    watch = VmWatch(arm)
    yield watch
    watch.close()


@pytest.mark.slow
def test_capacity_error_on_one_node_moves_both_nodes_to_the_next_region(
    azure_env: dict[str, str],
    arm: FakeArm,
    azure_sim: AzureVmSimulator,
    vm_watch: VmWatch,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from gpucloud.cli.app import app

    monkeypatch.setattr(
        AzureProvider, "capabilities", dataclasses.replace(AzureProvider.capabilities, poll_interval=0.3)
    )
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: mn-failover\nresources:\n  cloud: azure\n  regions: [eastus, westus2]\n  gpu: T4:1\n"
        'num_nodes: 2\nrun: echo "rank $GPUCLOUD_NODE_RANK of $GPUCLOUD_NUM_NODES, master $MASTER_ADDR"\n'
        "max_duration: 10m\n"
    )
    # As on Azure, node 1's allocation fails while node 0 is still being created (a VM takes a
    # while): the attempt gives up on node 0 at once and the group's deletion takes it.
    arm.inject("PUT", r"-eastus/providers/Microsoft.Compute/virtualMachines/node-0$", None, op_seconds=5.0)
    inj = arm.inject(
        "PUT",
        r"-eastus/providers/Microsoft.Compute/virtualMachines/node-1$",
        "AllocationFailed",
        message="Allocation failed.",
        async_=True,
        times=10,
    )
    result = CliRunner().invoke(app, ["run", str(job), "--cloud", "azure"], catch_exceptions=False)
    assert result.exit_code == 0, result.output[-3000:]
    assert inj.hits == 1
    second = re.search(r"\[\s*([\d.]+)s\] attempt 2: azure/westus2/", result.output)
    assert second and float(second[1]) < 4.0, "the attempt waited for node 0 instead of giving up"
    assert "[node 0] rank 0 of 2, master 127.0.0.1" in result.output
    assert "[node 1] rank 1 of 2, master 127.0.0.1" in result.output
    ran = {(re.sub(r"-a\d+$", "", rg).rsplit("-", 1)[1], name) for rg, name, _, _ in vm_watch.vms}  # -a<n>: attempt
    assert {("westus2", "node-0"), ("westus2", "node-1")} <= ran
    assert ("eastus", "node-1") not in ran and ("eastus", "node-0") not in ran  # failed / deleted while creating
    west = [(loc, ppg) for rg, _, loc, ppg in vm_watch.vms if re.search(r"-westus2(-a\d+)?$", rg)]
    assert len(west) == 2 and {loc for loc, _ in west} == {"westus2"} and len({ppg for _, ppg in west}) == 1
    assert re.search(r"-westus2(-a\d+)?/providers/microsoft.compute/proximityplacementgroups/ppg$", west[0][1].lower())
    azure_sim.wait_idle(20)
    assert wait_until(lambda: leftovers(arm) == [], timeout=20), leftovers(arm)
    assert wait_until(lambda: not azure_sim.leftover_processes(), timeout=20), azure_sim.leftover_processes()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch is not importable here (CI installs the CPU wheel)")
def test_ddp_example_on_two_azure_nodes(
    azure_env: dict[str, str], arm: FakeArm, azure_sim: AzureVmSimulator, vm_watch: VmWatch, tmp_path: Path
) -> None:
    """examples/ddp-2-nodes.yaml as it is, but for MASTER_PORT: both simulated guests share this
    host's loopback, so the run sets a free port through the job's own `env` (which wins over
    gpucloud's 29500, as it would for a user whose image already listens there)."""
    doc = yaml.safe_load((REPO / "examples" / "ddp-2-nodes.yaml").read_text())
    doc["workdir"] = str(REPO / "examples" / doc["workdir"])
    job = tmp_path / "ddp-2-nodes.yaml"
    doc["env"]["MASTER_PORT"] = str(_free_port())
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    t0 = time.monotonic()
    proc = cli("run", str(job), "--cloud", "azure", "--json", env=azure_env, cwd=tmp_path, timeout=240)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    assert result["status"] == "succeeded" and result["exit_code"] == 0
    log = proc.stderr
    losses = {int(r): v for r, v in re.findall(r"^\[node (\d)\] rank \d final loss (\S+)$", log, re.M)}
    assert set(losses) == {0, 1}, log[-4000:]
    assert losses[0] == losses[1]
    assert "[node 0] rank 0/2 (node 0" in log and "[node 1] rank 1/2 (node 1" in log and "backend gloo" in log
    assert f"master 127.0.0.1:{doc['env']['MASTER_PORT']}" in log
    out = Path(result["artifacts_dir"])
    metrics = [json.loads((out / f"node-{r}" / "metrics.json").read_text()) for r in (0, 1)]
    assert metrics[0]["final_loss"] == metrics[1]["final_loss"]
    assert (out / "node-0" / "outputs" / "model.pt").stat().st_size > 0
    # Both VMs in one placement group of the run's group, in one region; the guests saw T4s.
    assert sorted(name for _, name, _, _ in vm_watch.vms) == ["node-0", "node-1"]
    assert len({(rg, loc, ppg) for rg, _, loc, ppg in vm_watch.vms}) == 1 and vm_watch.vms[0][3]
    assert all(g.meta["gpu_name"] == "Tesla T4" for g in azure_sim.guests.values())
    # Nothing of the run remains: VMs, network, placement group, the group itself; no guest process.
    azure_sim.wait_idle(20)
    assert wait_until(lambda: leftovers(arm) == [], timeout=20), leftovers(arm)
    with arm.lock:
        assert not [r for r in arm.resources.values() if r.type.lower() == PPG_TYPE]
    assert wait_until(lambda: not azure_sim.leftover_processes(), timeout=20), azure_sim.leftover_processes()
    print(f"\n2-node DDP run on simulated Azure: {wall:.1f}s wall")


@pytest.mark.slow
def test_detached_nodes_delete_themselves_and_the_last_one_the_group(
    azure_env: dict[str, str], arm: FakeArm, azure_sim: AzureVmSimulator, tmp_path: Path
) -> None:
    """With no CLI watching, node 1 ends first: it deletes only its own VM (its peer still runs);
    node 0, the last to end, deletes the group. Neither kills the other."""
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: mn-detached\nresources:\n  cloud: azure\n  regions: [eastus]\n  gpu: T4:1\nnum_nodes: 2\n"
        'run: \'if [ "$GPUCLOUD_NODE_RANK" = 0 ]; then sleep 4; fi; echo "node $GPUCLOUD_NODE_RANK done"\'\n'
        "max_duration: 10m\n"
    )
    proc = cli("run", str(job), "--cloud", "azure", "--detach", "--json", env=azure_env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = json.loads(proc.stdout)["run_id"]
    assert wait_until(lambda: leftovers(arm) == [], timeout=60), "the last node did not delete the group"
    with arm.lock:
        deletes = [(p, who) for m, p, who in arm.calls if m == "DELETE" and who != OPERATOR_PRINCIPAL]
    vms = {g.vm_id.rsplit("/", 1)[1]: g for g in azure_sim.guests.values()}
    vm_deletes = [p for p, _ in deletes if "/virtualmachines/" in p.lower()]
    rg_deletes = [p for p, _ in deletes if re.search(r"/resourcegroups/[^/]+$", p, re.I)]
    assert [p.rsplit("/", 1)[1] for p in vm_deletes] == ["node-1"], deletes
    assert rg_deletes, deletes
    assert "deleting only this VM" in vms["node-1"].console()
    assert "deleting resource group" in vms["node-0"].console()
    logs = cli("logs", run_id, env=azure_env, cwd=tmp_path, timeout=60)
    assert "node 0 done" in logs.stdout and "node 1 done" in logs.stdout, logs.stdout[-2000:]
    azure_sim.wait_idle(20)
    assert wait_until(lambda: not azure_sim.leftover_processes(), timeout=20), azure_sim.leftover_processes()
