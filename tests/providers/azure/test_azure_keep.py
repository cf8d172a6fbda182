"""A kept machine on the Azure simulator (fake ARM, Azurite, the VM simulator), through the real CLI:
the second job (`run --on`) shows its first line sooner than the cold run on the same machine
(bench/bench_keep.py holds it to 5 s); idle for `keep`, the VM deletes its own resource group and
the run's follower records the end and removes the rest: nothing is left, without `down` or `gc`."""

from __future__ import annotations

import json
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
from tests.support.azure_sim import AzureVmSimulator, azure_sim  # noqa: F401
from tests.support.cli import cli
from tests.support.fake_arm import FakeArm
from tests.support.keep_timing import record, timed_first_line
from tests.support.local_runs import run_id_of

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _job(path: Path, run: str) -> Path:
    path.write_text(
        "name: keptaz\nresources:\n  cloud: azure\n  regions: [eastus]\n  gpu: T4:1\n  ssh: true\n"
        f"keep: 30s\nmax_duration: 10m\nrun: {run}\n"
    )
    return path


def test_a_kept_machine_takes_a_second_job_in_seconds_and_leaves_nothing(
    azure_env: dict[str, str],  # noqa: F811
    arm: FakeArm,  # noqa: F811
    azure_sim: AzureVmSimulator,  # noqa: F811
    tmp_path: Path,
) -> None:
    azure_env = {**azure_env, "GPUCLOUD_SSH_CIDR": "203.0.113.7/32"}  # `ssh: true`: the caller's address
    job = _job(tmp_path / "job.yaml", "echo first-line-cold")
    cold_s, proc = timed_first_line(["run", str(job)], env=azure_env, cwd=tmp_path, marker="first-line-cold")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = run_id_of(proc.stderr)
    assert "the machine is kept for" in proc.stderr
    assert leftovers(arm), "a kept run's machine stays"
    keys = Path(azure_env["GPUCLOUD_HOME"]) / "keys"
    assert list(keys.glob(f"*{run_id}*")), "its session key (the NSG rule for this caller is in its group)"
    job = _job(tmp_path / "job.yaml", "echo first-line-kept; exit 4")
    kept_s, proc = timed_first_line(
        ["run", "--on", run_id, str(job)], env=azure_env, cwd=tmp_path, marker="first-line-kept"
    )
    assert proc.returncode == 4, proc.stderr[-3000:]
    record("azure-simulator", cold_s, kept_s)
    # The 5 s budget is bench/bench_keep.py's to hold (a timed assert fails on a loaded CI machine,
    # where this path measured 4.4-4.8 s); here the kept machine must beat the cold run outright.
    assert kept_s < cold_s, (kept_s, cold_s, proc.stderr[-2000:])
    # Idle for 30 s: the VM deletes its own resource group, as at the end of any run.
    assert wait_until(lambda: leftovers(arm) == [], timeout=120), "the kept VM did not end by its idle time"
    assert wait_until(lambda: not azure_sim.leftover_processes(), timeout=20)
    # Nobody runs `down` or `gc`: the run's follower records the end and removes what is left here
    # (the run's resources in the store, its key and ssh entries under GPUCLOUD_HOME).
    assert wait_until(lambda: _torn_down(azure_env, run_id), timeout=60), cli("status", run_id, env=azure_env).stderr
    assert leftovers(arm) == [] and list(keys.glob(f"*{run_id}*")) == []


def _torn_down(env: dict[str, str], run_id: str) -> bool:
    doc = json.loads(cli("status", run_id, "--json", env=env, check=True).stdout)
    done = any("torn down" in e["message"] and "nothing left" in e["message"] for e in doc["events"])
    return done and all(r["status"] == "deleted" for r in doc["resources"])
