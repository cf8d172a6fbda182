"""`max_cost:` on the AWS simulator (docs/SPOT.md, "max_cost"): `plan` keeps only candidates that can
finish max_duration within it, and a run whose spend reaches it (here: a spot run preempted once, its
relaunch spending on top of the first attempt) is ended by its node at the deadline the cap set,
within a poll of the moment, with what the job saved brought back as artifacts and the run's status
saying why (tests/support/max_cost_runs.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.cli import cli
from tests.support.max_cost_runs import MAX_DURATION_S, capped_job, check_ended_at_the_cap, run_preempted_once
from tests.support.moto_server import Moto, moto, moto_server, tagged_alive  # noqa: F401

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
PRICE = 0.2  # the shipped catalog's g4dn.xlarge spot price in us-east-1 ($/h)
MAX_COST = round(PRICE * MAX_DURATION_S / 3600 * 1.02, 6)  # one whole attempt fits; two do not
RESOURCES = {"cloud": "aws", "regions": ["us-east-1"], "instance_type": "g4dn.xlarge"}


def _env(moto: Moto, home: Path) -> dict[str, str]:  # noqa: F811
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUCLOUD_TEST_", "AZURE_"))}
    env.update(moto.env)
    env.update({"GPUCLOUD_HOME": str(home), "CI": "true", "PYTHONPATH": str(REPO)})
    env["GPUCLOUD_SSH_CIDR"] = "203.0.113.7/32"
    return env


def test_plan_refuses_what_max_cost_cannot_pay(moto: Moto, gpucloud_home: Path, tmp_path: Path) -> None:  # noqa: F811
    env = _env(moto, gpucloud_home)
    cheap = capped_job(tmp_path / "cheap.yaml", RESOURCES, round(PRICE * MAX_DURATION_S / 3600 * 0.5, 6))
    out = cli("plan", str(cheap), env=env, timeout=120)
    said = " ".join(out.stderr.split())
    assert out.returncode == 2, out.stderr
    assert "g4dn.xlarge: spot $0.200/h > $0.100/h (max_cost $0.000833 over 0.00833333 h x 1 node(s))" in said, said


def test_a_run_ends_when_its_spend_reaches_max_cost(
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    gpucloud_home: Path,
    tmp_path: Path,
) -> None:
    env = _env(moto, gpucloud_home)
    job = capped_job(tmp_path / "job.yaml", RESOURCES, MAX_COST)
    run_id, done = run_preempted_once("tests.support.aws_cli", job, env, gpucloud_home, tmp_path)
    check_ended_at_the_cap(gpucloud_home, run_id, done, MAX_COST, PRICE, within_s=10)
    aws_sim.wait_idle(30)
    assert tagged_alive(moto, run_id) == []
