"""Spot recovery on the AWS and Azure simulators (docs/SPOT.md, "Done when"): a job counting to N
with a checkpoint, preempted twice with `gpucloud preempt`, resumes each time and ends with exit
0, N correct, three attempts in `gpucloud cost RUN --json` and nothing left. On AWS the job is spot
with `fallback: on-demand` and max_restarts 2: the third RunInstances carries no
InstanceMarketOptions (moto marks an instance launched with them `InstanceLifecycle: spot`).
The clouds' own notices (EC2 IMDS `spot/instance-action`, Azure Scheduled Events `Preempt`), sent by
the simulators, end a run without `recovery` as `preempted` (exit 75).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpucloud.state.runs_db import Store
from tests.support.aws_runs import aws_env  # noqa: F401
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.azure_fixtures import arm, azure_env, azurite, fake_arm_server, leftovers  # noqa: F401
from tests.support.azure_sim import AzureVmSimulator, azure_sim  # noqa: F401
from tests.support.fake_arm import FakeArm
from tests.support.moto_server import Moto, moto, moto_server, tagged_alive  # noqa: F401
from tests.support.polling import wait_until  # noqa: F401
from tests.support.spot_job import check_finished_count, latest_run, preempted_twice, run_log, write_count_job

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
N = 400  # 0.1 s a step: long enough that each attempt is still counting when it is preempted
LONG = {"N": 100000, "STEP_S": 0.1}


def _run_preempted_twice(env: dict[str, str], home: Path, job: Path, module: str) -> tuple[str, str]:
    run_id, proc = preempted_twice([module, "run", str(job)], home, Path.cwd(), env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run_id, proc.stderr


def test_aws_spot_preempted_twice_falls_back_to_on_demand(
    aws_env: dict[str, str],
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,
    gpucloud_home: Path,
) -> None:
    job = write_count_job(
        Path.cwd() / "job",
        n=N,
        cloud="aws",
        extra={
            "resources": {"cloud": "aws", "regions": ["us-east-1", "us-west-2"], "gpu": "T4:1", "spot": True},
            "recovery": {"on": ["preemption"], "max_restarts": 2, "fallback": "on-demand"},
        },
    )
    run_id, err = _run_preempted_twice(aws_env, gpucloud_home, job, "tests.support.aws_cli")
    assert "falling back to on-demand" in err
    assert aws_sim.imds_polls > 0  # the guard also watched EC2's own notice (the simulator's IMDS)
    report = check_finished_count(gpucloud_home, run_id, Path.cwd(), N, env=aws_env)
    assert [a["market"] for a in report["attempts"]] == ["spot", "spot", "on-demand"]
    # What EC2 was asked for: moto marks instances launched with InstanceMarketOptions as spot.
    import boto3

    lifecycles = []
    for att in Store(gpucloud_home / "state.db").get_run(run_id).attempts:
        handle = json.loads(att.handle_json or "{}")
        ec2 = boto3.client(
            "ec2",
            region_name=att.region,
            endpoint_url=moto.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        inst = ec2.describe_instances(InstanceIds=handle["nodes"])["Reservations"][0]["Instances"][0]
        lifecycles.append(inst.get("InstanceLifecycle", "on-demand"))
    assert lifecycles == ["spot", "spot", "on-demand"]
    aws_sim.wait_idle(30)
    assert tagged_alive(moto, run_id) == [] and aws_sim.leftover_processes() == []


def test_azure_preempted_twice_resumes_and_finishes(
    azure_env: dict[str, str],
    arm: FakeArm,  # noqa: F811
    azure_sim: AzureVmSimulator,
    gpucloud_home: Path,
) -> None:
    job = write_count_job(
        Path.cwd() / "job",
        n=N,
        cloud="azure",
        extra={"resources": {"cloud": "azure", "regions": ["eastus"], "gpu": "T4:1"}},
    )
    run_id, _ = _run_preempted_twice(azure_env, gpucloud_home, job, "gpucloud")
    check_finished_count(gpucloud_home, run_id, Path.cwd(), N, env=azure_env)
    azure_sim.wait_idle(30)
    assert leftovers(arm) == [] and azure_sim.leftover_processes() == []


# ---- the clouds' own notices, delivered by the simulators (no recovery: the run ends preempted) ------------


def _run_until_sim_preempts(
    env: dict[str, str], home: Path, job: Path, module: str, preempt: Callable[[], None]
) -> tuple[str, str]:
    """Run the job; once it runs and has checkpointed, the simulated cloud sends its own notice."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "run", str(job)],
        env=env,
        cwd=Path.cwd(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert wait_until(lambda: latest_run(home), 60)
        run_id = latest_run(home) or ""
        assert wait_until(lambda: "(interval" in run_log(home, run_id), 120), run_log(home, run_id)
        preempt()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, err[-3000:]
    return run_id, run_log(home, run_id)


def test_aws_imds_interruption_notice_ends_the_run_preempted(
    aws_env: dict[str, str],
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,
    gpucloud_home: Path,
) -> None:
    job = write_count_job(
        Path.cwd() / "job",
        n=0,
        cloud="aws",
        extra={
            "resources": {"cloud": "aws", "regions": ["us-east-1"], "gpu": "T4:1", "spot": True},
            "recovery": None,
            "env": LONG,
        },
    )
    run_id, log = _run_until_sim_preempts(
        aws_env, gpucloud_home, job, "tests.support.aws_cli", lambda: aws_sim.preempt(aws_sim.booted[-1])
    )
    assert 'preemption notice: spot interruption notice {"action":"terminate"' in log, log[-2000:]
    run = Store(gpucloud_home / "state.db").get_run(run_id)
    assert run.status == "preempted" and run.attempts[0].end_reason.startswith("preempted: spot interruption")
    aws_sim.wait_idle(30)
    assert tagged_alive(moto, run_id) == []
    # the guest's processes end with its terminated instance, a moment after its bootstrap
    assert wait_until(lambda: not aws_sim.leftover_processes(), timeout=20), aws_sim.leftover_processes()


def test_azure_scheduled_events_preempt_ends_the_run_preempted(
    azure_env: dict[str, str],
    arm: FakeArm,  # noqa: F811
    azure_sim: AzureVmSimulator,
    gpucloud_home: Path,
) -> None:
    job = write_count_job(
        Path.cwd() / "job",
        n=0,
        cloud="azure",
        extra={"resources": {"cloud": "azure", "regions": ["eastus"], "gpu": "T4:1"}, "recovery": None, "env": LONG},
    )
    run_id, log = _run_until_sim_preempts(
        azure_env, gpucloud_home, job, "gpucloud", lambda: azure_sim.preempt(azure_sim.booted[-1])
    )
    assert "preemption notice: Scheduled Events: Preempt" in log, log[-2000:]
    assert Store(gpucloud_home / "state.db").get_run(run_id).status == "preempted"
    azure_sim.wait_idle(30)
    assert leftovers(arm) == []
    assert wait_until(lambda: not azure_sim.leftover_processes(), timeout=20), azure_sim.leftover_processes()
