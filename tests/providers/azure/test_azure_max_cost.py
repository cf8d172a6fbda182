"""`max_cost:` on the Azure simulator (docs/SPOT.md, "max_cost"), without a laptop: a spot run
preempted once (Azure's Scheduled Events) is relaunched by the CLI following it, which is then
SIGKILLed. Nobody follows the relaunched attempt, and its node still ends the run at the deadline
the cap set, within a heartbeat of it, with what the job saved uploaded: `collect` reports
`max-cost` (exit 124) with the artifact, billed to the node's own end (what it spent is its cap),
and nothing is left behind (tests/support/max_cost_runs.py;
the followed case is tests/providers/aws/test_aws_max_cost.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpucloud.run.commands import channel_for
from gpucloud.state.runs_db import Store
from tests.support.azure_fixtures import arm, azure_env, azurite, fake_arm_server, leftovers  # noqa: F401
from tests.support.azure_sim import AzureVmSimulator, azure_sim  # noqa: F401
from tests.support.cli import cli
from tests.support.fake_arm import FakeArm
from tests.support.max_cost_runs import MAX_DURATION_S, capped_job, run_preempted_once
from tests.support.polling import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
PRICE = 0.062699  # the shipped catalog's Standard_NC4as_T4_v3 spot price in eastus ($/h)
MAX_COST = round(PRICE * MAX_DURATION_S / 3600 * 1.02, 6)  # one whole attempt fits; two do not
HEARTBEAT_S = 15.0  # Capabilities.heartbeat_interval


def test_a_run_nobody_follows_ends_at_its_max_cost(
    azure_env: dict[str, str],  # noqa: F811
    arm: FakeArm,  # noqa: F811
    azure_sim: AzureVmSimulator,  # noqa: F811
    gpucloud_home: Path,
    tmp_path: Path,
) -> None:
    resources = {"cloud": "azure", "regions": ["eastus"], "instance_type": "Standard_NC4as_T4_v3"}
    job = capped_job(tmp_path / "job.yaml", resources, MAX_COST)
    run_id, killed = run_preempted_once("gpucloud", job, azure_env, gpucloud_home, tmp_path, leave=True)
    assert killed.returncode == -9 and "restart 1 of 1 after preempted" in killed.stderr, killed.stderr[-3000:]
    store = Store(gpucloud_home / "state.db")
    run = store.get_run(run_id)
    assert run is not None and run.deadline is not None
    assert run.deadline - run.attempts[1].started_at < MAX_DURATION_S - 1  # the cap set the relaunch's deadline
    channel = channel_for(run)
    assert channel is not None
    ended = lambda: ((channel.read_status(run_id, 0) or {}).get("stages") or {}).get("done")  # noqa: E731
    assert wait_until(ended, timeout=run.deadline + 60 - time.time(), step=1.0)
    done = ended()["start"]
    assert run.deadline - 1 <= done < run.deadline + HEARTBEAT_S, (done, run.deadline)  # its artifacts went up first
    out = cli("collect", run_id, "--json", env=azure_env, cwd=tmp_path)
    assert out.returncode == 124, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["status"] == "max-cost" and doc["exit_code"] == 124, doc
    assert (Path(doc["directory"]) / "out" / "early.txt").read_text() == "saved\n"
    after = store.get_run(run_id) or run
    assert after.message.startswith(f"max_cost ${MAX_COST:g} reached (deadline ")
    # billed to the node's own end, not to the collect: what it spent is its cap (within a heartbeat)
    assert after.attempts[1].ended_at == pytest.approx(done, abs=0.01), (after.attempts[1].ended_at, done)
    assert MAX_COST <= after.cost() < MAX_COST + PRICE * HEARTBEAT_S / 3600, after.cost()
    azure_sim.wait_idle(30)
    assert leftovers(arm) == []
