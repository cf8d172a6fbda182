"""`max_cost:` on the Azure simulator (docs/SPOT.md, "max_cost"): a spot run preempted once (Azure's
Scheduled Events), its relaunch spending on top of the first attempt, is ended by its node at the
deadline the cap set, within a heartbeat of reaching it, with what the job saved brought back as
artifacts, and nothing left behind (tests/support/max_cost_runs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.azure_fixtures import arm, azure_env, azurite, fake_arm_server, leftovers  # noqa: F401
from tests.support.azure_sim import AzureVmSimulator, azure_sim  # noqa: F401
from tests.support.fake_arm import FakeArm
from tests.support.max_cost_runs import MAX_DURATION_S, capped_job, check_ended_at_the_cap, run_preempted_once

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
PRICE = 0.062699  # the shipped catalog's Standard_NC4as_T4_v3 spot price in eastus ($/h)
MAX_COST = round(PRICE * MAX_DURATION_S / 3600 * 1.02, 6)  # one whole attempt fits; two do not
HEARTBEAT_S = 15.0  # Capabilities.heartbeat_interval


def test_a_run_ends_when_its_spend_reaches_max_cost(
    azure_env: dict[str, str],  # noqa: F811
    arm: FakeArm,  # noqa: F811
    azure_sim: AzureVmSimulator,  # noqa: F811
    gpucloud_home: Path,
    tmp_path: Path,
) -> None:
    resources = {"cloud": "azure", "regions": ["eastus"], "instance_type": "Standard_NC4as_T4_v3"}
    job = capped_job(tmp_path / "job.yaml", resources, MAX_COST)
    run_id, done = run_preempted_once("gpucloud", job, azure_env, gpucloud_home, tmp_path)
    check_ended_at_the_cap(gpucloud_home, run_id, done, MAX_COST, PRICE, within_s=HEARTBEAT_S)
    azure_sim.wait_idle(30)
    assert leftovers(arm) == []
