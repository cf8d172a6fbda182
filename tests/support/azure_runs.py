"""Runs on the Azure simulator (the fake ARM server, Azurite and the VM simulator) through the real
CLI: a job file, and waiting until the machines a test started have settled."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.azure_fixtures import wait_until
from tests.support.azure_sim import AzureVmSimulator
from tests.support.fake_arm import FakeArm

RUN_RG = r"/resourcegroups/gpucloud-(?!storage-)[^/]*-eastus(?:-a\d+)?"  # an attempt after the first adds -a<n>


def write_azure_job(
    path: Path,
    *,
    run: str,
    regions: str = "[eastus]",
    max_duration: str = "10m",
    name: str = "azjob",
    artifacts: str = "[]",
) -> Path:
    """A job file for the Azure cloud: one T4 in eastus for 10 minutes unless told otherwise."""
    path.write_text(
        f"name: {name}\nresources:\n  cloud: azure\n  regions: {regions}\n  gpu: T4:1\n"
        f"run: {run}\nartifacts: {artifacts}\nmax_duration: {max_duration}\n"
    )
    return path


def settle(arm: FakeArm, sim: AzureVmSimulator, timeout: float = 30, *, delete_refused: bool = False) -> None:
    """Let running guests and in-flight deletions finish. `delete_refused`: the fault refuses every
    DELETE of a run's group, the VMs' own too, so a guest whose self-delete was refused only retries
    it (every DELETE_PAUSE_S, for minutes) until the fault is lifted or its VM deleted: it has
    settled, and waiting out `timeout` would add nothing."""
    wait_until(lambda: _guests_settled(arm, sim, delete_refused), timeout=timeout, interval=0.1)
    wait_until(lambda: not [r for r in arm.snapshot() if r["state"] == "Deleting"], timeout=10)


def _guests_settled(arm: FakeArm, sim: AzureVmSimulator, delete_refused: bool) -> bool:
    """No guest's bootstrap runs any more, or (`delete_refused`) each that does has tried its
    self-delete: a DELETE of a run's group by the VM's own identity."""
    with sim.lock:
        running = [g for g in sim.guests.values() if g.vm.alive()]
    if not running or not delete_refused:
        return not running
    rx = re.compile(RUN_RG + "$", re.I)
    with arm.lock:
        tried = {who for m, p, who in arm.calls if m == "DELETE" and rx.search(p)}
        principals = [arm.resources.get(g.vm_id.lower()) for g in running]
    return all(r is not None and (r.body.get("identity") or {}).get("principalId") in tried for r in principals)
