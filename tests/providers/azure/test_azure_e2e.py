"""End to end on Azure, against the fake ARM server, Azurite and the VM simulator.

- The examples (a100-azure.yaml, t4-any-cloud.yaml) run through the real CLI in a subprocess:
  logs stream, artifacts come back, nothing of the run remains.
- The fault matrix: an error injected at each ARM call the CLI makes (resource group, NSG, VNet,
  public IP, NIC, VM, role assignment, storage account, listKeys, the teardown's DELETE) x
  capacity / quota / throttling (429 until the SDK gives up) / generic (500), the last two (one
  path in the product) in turn over the calls (tests/support/fault_cells.py): afterwards nothing
  tagged is left, after the run's own teardown or after `gpucloud gc`. Plus Ctrl-C and a killed
  CLI in each phase (network, VM creation, job running, teardown).
- The VM deletes its own resource group: at the end of a detached run's job, and at the deadline
  when the job hangs.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from tests.support.azure_fixtures import (  # noqa: F401  (fixtures)
    arm,
    azure_env,
    azurite,
    fake_arm_server,
    leftovers,
    wait_until,
)
from tests.support.azure_runs import RUN_RG, settle, write_azure_job
from tests.support.azure_sim import AzureVmSimulator, azure_sim  # noqa: F401
from tests.support.cli import cli, start_cli
from tests.support.fake_arm import OPERATOR_PRINCIPAL, FakeArm
from tests.support.fault_cells import SAME_PATH, cells

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

QUOTA_MSG = (
    "Operation could not be completed as it results in exceeding approved standardNCASv3_T4Family Cores "
    "quota. Additional details - Deployment Model: Resource Manager, Location: eastus, Current Limit: 0"
)


# ---- the examples ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "example,gpu_name,size",
    [
        ("a100-azure.yaml", "NVIDIA A100 80GB PCIe", "Standard_NC24ads_A100_v4"),
        ("t4-any-cloud.yaml", "Tesla T4", "Standard_NC4as_T4_v3"),
    ],
)
def test_example_runs_on_azure_with_logs_and_artifacts_and_leaves_nothing(
    azure_env: dict[str, str], arm: FakeArm, azure_sim: AzureVmSimulator, example: str, gpu_name: str, size: str
) -> None:
    pytest.importorskip("torch", reason="the examples train with PyTorch (CPU wheel in .ci/run)")
    proc = cli("run", str(EXAMPLES / example), "--cloud", "azure", "--json", timeout=180, env=azure_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["status"] == "succeeded" and doc["exit_code"] == 0
    art = Path(doc["artifacts_dir"])
    assert (art / "metrics.json").is_file() and (art / "outputs" / "model.pt").is_file()
    assert "epoch 1/" in proc.stderr  # the streamed log (on stderr with --json)
    assert leftovers(arm) == [], "nothing of the run may remain"
    (guest,) = azure_sim.guests.values()
    assert "nvidia-smi --query-gpu=name --format=csv,noheader" in guest.stub_calls()
    assert guest.meta["size"] == size and guest.meta["gpu_name"] == gpu_name
    # The log is there after teardown.
    logs = cli("logs", doc["run_id"], env=azure_env)
    assert logs.returncode == 0 and "epoch" in logs.stdout


# ---- the fault matrix ----------------------------------------------------------------------------------

# (name, method, path regex, expected exit code of the run, needs a second region)
CALLS = [
    ("resource-group", "PUT", RUN_RG + "$", 75, False),
    ("nsg", "PUT", RUN_RG + "/providers/Microsoft.Network/networkSecurityGroups/", 75, False),
    ("vnet", "PUT", RUN_RG + "/providers/Microsoft.Network/virtualNetworks/", 75, False),
    ("public-ip", "PUT", RUN_RG + "/providers/Microsoft.Network/publicIPAddresses/", 75, False),
    ("nic", "PUT", RUN_RG + "/providers/Microsoft.Network/networkInterfaces/", 75, False),
    ("vm", "PUT", RUN_RG + "/providers/Microsoft.Compute/virtualMachines/", 75, False),
    ("role-assignment", "PUT", RUN_RG + "/providers/Microsoft.Authorization/roleAssignments/", 75, False),
    ("storage-account", "PUT", r"/storageAccounts/[^/]+$", 75, False),
    ("list-keys", "POST", r"/listKeys$", 75, False),
    ("vm-then-failover", "PUT", RUN_RG + "/providers/Microsoft.Compute/virtualMachines/", 0, True),
    ("teardown-delete", "DELETE", RUN_RG + "$", 70, False),
]
KINDS = {
    "capacity": dict(code="AllocationFailed", message="Allocation failed. We do not have sufficient capacity."),
    "quota": dict(code="OperationNotAllowed", message=QUOTA_MSG),
    "throttle": dict(code="TooManyRequests", message="Too many requests."),
    "generic": dict(code="InternalServerError", message="An internal error occurred."),
}
MATRIX_RESULTS: dict[str, int] = {}  # cell -> leftovers found at the end


@pytest.fixture
def fast_lifecycle(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process runs read the channel often, so matrix cells with a job finish quickly."""
    import dataclasses

    from gpucloud.providers.azure import AzureProvider

    monkeypatch.setattr(
        AzureProvider, "capabilities", dataclasses.replace(AzureProvider.capabilities, poll_interval=0.3)
    )


# Throttling and an Azure-side failure take one path and alternate over the calls
# (tests/support/fault_cells.py); every other kind meets every call.
CELLS = [
    pytest.param(*by_name[call], kind, id=f"{call}-{kind}")
    for by_name in [{c[0]: c for c in CALLS}]
    for call, kind in cells([c[0] for c in CALLS], KINDS)
]


@pytest.mark.parametrize("call,method,path,expected,two_regions,kind", CELLS)
def test_fault_matrix_leaves_nothing(
    azure_env: dict[str, str],
    arm: FakeArm,
    azure_sim: AzureVmSimulator,
    fast_lifecycle: None,
    tmp_path: Path,
    call: str,
    method: str,
    path: str,
    expected: int | None,
    two_regions: bool,
    kind: str,
) -> None:
    from typer.testing import CliRunner

    from gpucloud.cli.app import app

    job = write_azure_job(
        tmp_path / "job.yaml", run="echo fault-ok", regions="[eastus, westus2]" if two_regions else "[eastus]"
    )
    spec = KINDS[kind]
    async_ = call.startswith("vm") and kind == "capacity"  # allocation failures arrive with the operation
    inj = arm.inject(method, path, spec["code"], message=spec["message"], times=10_000, async_=async_)
    runner = CliRunner()
    result = runner.invoke(app, ["run", str(job), "--cloud", "azure"], catch_exceptions=False)
    assert inj.hits >= 1, f"the fault at {call} was never reached"
    if expected is not None:
        assert result.exit_code == expected, result.output[-2000:]
    if expected == 75:
        assert "no candidate could be provisioned" in result.output
    if kind == "quota" and expected == 75:
        assert "Standard NCASv3_T4 Family vCPUs" in result.output
    settle(arm, azure_sim, delete_refused=call == "teardown-delete")
    arm.clear_injections()
    if leftovers(arm):
        gc = runner.invoke(app, ["gc", "--yes"], catch_exceptions=False)
        assert gc.exit_code == 0, gc.output
        settle(arm, azure_sim)
    left = leftovers(arm)
    MATRIX_RESULTS[f"{call}/{kind}"] = len(left)
    assert left == [], left
    assert wait_until(lambda: not azure_sim.leftover_processes(), timeout=20), azure_sim.leftover_processes()


# ---- Ctrl-C and a killed CLI in each phase -----------------------------------------------------------------

PHASES = {
    # phase: (job command, injected stall (method, path), condition that says the CLI is in that phase)
    "network": ("echo hi", ("PUT", RUN_RG + "/providers/Microsoft.Network/networkSecurityGroups/")),
    "vm": ("echo hi", ("PUT", RUN_RG + "/providers/Microsoft.Compute/virtualMachines/")),
    "running": ("sleep 4; echo done", None),
    "teardown": ("echo hi", ("DELETE", RUN_RG + "$")),
}


def _reached(arm: FakeArm, sim: AzureVmSimulator, phase: str, stall: tuple[str, str] | None) -> bool:
    if stall is not None:
        rx = re.compile(stall[1], re.I)
        with arm.lock:
            return any(m == stall[0] and rx.search(p) and who == OPERATOR_PRINCIPAL for m, p, who in arm.calls)
    with sim.lock:
        guests = list(sim.guests.values())
    return any("stage run" in g.console() for g in guests)


@pytest.mark.parametrize("how", ["ctrl-c", "killed"])
@pytest.mark.parametrize("phase", list(PHASES))
def test_interrupted_or_killed_cli_leaves_nothing(
    azure_env: dict[str, str], arm: FakeArm, azure_sim: AzureVmSimulator, tmp_path: Path, phase: str, how: str
) -> None:
    run, stall = PHASES[phase]
    job = write_azure_job(tmp_path / "job.yaml", run=run)
    if stall is not None:
        arm.inject(stall[0], stall[1], None, delay=1.5, times=1, principal=OPERATOR_PRINCIPAL)
    proc = start_cli("run", str(job), "--cloud", "azure", env=azure_env)
    try:
        assert wait_until(lambda: _reached(arm, azure_sim, phase, stall) or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, f"the CLI ended before the {phase} phase: {proc.communicate()[1][-2000:]}"
        proc.send_signal(signal.SIGINT if how == "ctrl-c" else signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    if how == "ctrl-c":
        # Ctrl-C during the teardown is answered with "still tearing down" and changes nothing.
        assert proc.returncode == (0 if phase == "teardown" else 130), err[-2000:]
        assert "Traceback" not in err
    settle(arm, azure_sim)
    if leftovers(arm):  # gc in this process (the CLI's start-up is not what this cell tests)
        from typer.testing import CliRunner

        from gpucloud.cli.app import app

        gc = CliRunner().invoke(app, ["gc", "--yes"], catch_exceptions=False)
        assert gc.exit_code == 0, gc.output
        settle(arm, azure_sim)
    left = leftovers(arm)
    MATRIX_RESULTS[f"{how}@{phase}"] = len(left)
    assert left == [], left
    assert wait_until(lambda: not azure_sim.leftover_processes(), timeout=20), azure_sim.leftover_processes()


def test_fault_matrix_summary() -> None:
    """Prints the matrix size and the leak count (run with -s to see it)."""
    leaks = sum(MATRIX_RESULTS.values())
    print(
        f"\nAzure fault matrix: {len(MATRIX_RESULTS)} cells ({len(CALLS)} ARM calls x {len(KINDS)} error "
        f"kinds, {'/'.join(SAME_PATH)} in turn: {len(CELLS)} cells; + {len(PHASES)} phases x Ctrl-C/kill), "
        f"leaked resources: {leaks}"
    )
    assert leaks == 0


# ---- the VM deletes its own resource group --------------------------------------------------------------


def test_detached_run_vm_deletes_its_group_when_the_job_ends(
    azure_env: dict[str, str], arm: FakeArm, azure_sim: AzureVmSimulator, tmp_path: Path
) -> None:
    job = write_azure_job(tmp_path / "job.yaml", run="echo detached-job-output; sleep 8")
    proc = cli("run", str(job), "--cloud", "azure", "--detach", "--json", env=azure_env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_id = json.loads(proc.stdout)["run_id"]
    assert leftovers(arm), "the CLI returned right after provisioning"
    assert wait_until(lambda: leftovers(arm) == [], timeout=60), "the VM did not delete its resource group"
    with arm.lock:
        deletes = [(m, p, who) for m, p, who in arm.calls if m == "DELETE" and "/resourcegroups/" in p.lower()]
    assert deletes and all(who != OPERATOR_PRINCIPAL for _, _, who in deletes), deletes  # the VM's own identity
    status = cli("status", run_id, "--json", env=azure_env)
    assert status.returncode == 0 and "succeeded" in status.stdout, status.stdout + status.stderr
    logs = cli("logs", run_id, env=azure_env)
    assert "detached-job-output" in logs.stdout
    gc = cli("gc", "--yes", env=azure_env)
    assert gc.returncode == 0 and leftovers(arm) == []


def test_vm_deletes_its_group_at_the_deadline_when_the_job_hangs(
    azure_env: dict[str, str], arm: FakeArm, azure_sim: AzureVmSimulator, tmp_path: Path
) -> None:
    """A detached run (no CLI after provisioning) whose job hangs: at max_duration the VM's own
    watchdog ends the job, reports "deadline" and deletes the run's resource group."""
    # 20 s: on a loaded 2-core machine provisioning alone took 8 s, and the deadline ran out first.
    job = write_azure_job(tmp_path / "job.yaml", run="echo hanging; sleep 600", max_duration="20s")
    proc = cli("run", str(job), "--cloud", "azure", "--detach", "--json", env=azure_env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_id = json.loads(proc.stdout)["run_id"]
    assert leftovers(arm), "the CLI returned right after provisioning"
    assert wait_until(lambda: leftovers(arm) == [], timeout=60), "the VM did not delete its group at the deadline"
    with arm.lock:
        deletes = [(m, p, who) for m, p, who in arm.calls if m == "DELETE" and "/resourcegroups/" in p.lower()]
    assert deletes and all(who != OPERATOR_PRINCIPAL for _, _, who in deletes), deletes  # the VM's own identity
    status = cli("status", run_id, "--json", env=azure_env)
    assert status.returncode == 0 and "deadline" in status.stdout, status.stdout + status.stderr
    logs = cli("logs", run_id, env=azure_env)
    assert "hanging" in logs.stdout and "max_duration passed" in logs.stdout
    assert wait_until(lambda: not azure_sim.leftover_processes(), timeout=20)
