"""`container:` on the Azure simulator (fake ARM + Azurite + simulated GPU VMs, tests/support/azure_sim.py)
with the real podman and registry (tests/support/containers.py): a spot job in its busybox image reads
its input (a local folder), sees the node's GPUCLOUD_* variables, the GPUs (the CDI spec's variable,
tests/support/container_gpu.py) and its secret (masked in the log), counts with a checkpoint, is
evicted once (Azure's Scheduled Events `Preempt`, from the fake IMDS), resumes from its checkpoint on
a new VM, writes its artifact and ends with its own exit code 3: the run is `failed`, exit 3. No
container, VM process or Azure resource is left."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
import yaml

from gpucloud.state.runs_db import Store
from tests.support.azure_fixtures import (  # noqa: F401  (fixtures)
    arm,
    azure_env,
    azurite,
    fake_arm_server,
    leftovers,
    wait_until,
)
from tests.support.azure_sim import AzureVmSimulator, azure_sim  # noqa: F401
from tests.support.cli import start_cli
from tests.support.container_gpu import cdi_spec, toolkit_present  # noqa: F401
from tests.support.container_jobs import COUNT_SH, containers_of, count_job
from tests.support.containers import ContainerLab, container_lab  # noqa: F401
from tests.support.fake_arm import FakeArm
from tests.support.spot_job import latest_run, resumed_at, run_log

# every test here runs a GPU container: the CDI spec and a toolkit on PATH (tests/support/container_gpu.py)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.usefixtures("cdi_spec", "toolkit_present"),
]

SECRET = "az_" + hashlib.sha256(f"azure-box-{os.getpid()}".encode()).hexdigest()[:32]
HEADER = """\
cat data/in.txt
echo "run=$GPUCLOUD_RUN_ID rank=$GPUCLOUD_NODE_RANK nodes=$GPUCLOUD_NUM_NODES gpu=$GPUCLOUD_TEST_GPU path=$PATH"
echo "token=$BOX_TOKEN"
printf %s "$BOX_TOKEN" | sha256sum
"""
FOOTER = """\
mkdir -p out && cp result.txt out/count.txt
echo "result of $GPUCLOUD_RUN_ID" > out/result.txt
exit "$CODE"
"""
N = 100  # 0.1 s a step: the first VM is evicted at about 20 (its first checkpoint, then a notice poll of 5 s)


def _job(folder: Path, image: str) -> Path:
    """The counting job of the local container tests, with an input folder, a secret, an artifact
    folder, one restart and exit code 3 at the end."""
    resources = {"cloud": "azure", "regions": ["eastus"], "gpu": "T4:1", "spot": True}
    job = count_job(folder, image, N, resources)
    (folder / "count.sh").write_text(HEADER + COUNT_SH + FOOTER)
    (folder / "in").mkdir()
    (folder / "in" / "in.txt").write_text("input-line-42\n")
    doc = yaml.safe_load(job.read_text())
    doc.update(
        env={**doc["env"], "CODE": 3},
        recovery={"on": ["preemption"], "max_restarts": 1},
        inputs={"data": "./in"},
        secrets=["BOX_TOKEN"],
        artifacts=["out/"],
        max_duration="5m",
    )
    job.write_text(yaml.safe_dump(doc, sort_keys=False))
    return job


def _first_checkpoint_up(sim: AzureVmSimulator) -> bool:
    """The first VM's job runs and has uploaded a checkpoint (its console: no wait for the CLI's log)."""
    with sim.lock:
        guests = list(sim.guests.values())
    return any("checkpoint 1 uploaded (interval" in g.console() for g in guests)


def test_azure_spot_container_job_with_input_secret_and_artifact_is_evicted_resumes_and_exits_3(
    azure_env: dict[str, str],  # noqa: F811
    arm: FakeArm,  # noqa: F811
    azure_sim: AzureVmSimulator,  # noqa: F811
    gpucloud_home: Path,
    container_lab: ContainerLab,  # noqa: F811
) -> None:
    job = _job(Path.cwd() / "job", container_lab.image)
    env = {**azure_env, "BOX_TOKEN": SECRET}
    t0 = time.monotonic()
    proc = start_cli("run", str(job), "--json", env=env, cwd=Path.cwd())
    try:
        assert wait_until(lambda: latest_run(gpucloud_home), 60)
        run_id = latest_run(gpucloud_home) or ""
        assert wait_until(lambda: _first_checkpoint_up(azure_sim), 120), run_log(gpucloud_home, run_id)
        azure_sim.preempt(azure_sim.booted[-1])
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - t0
    assert proc.returncode == 3, err[-4000:]
    doc = json.loads(out)
    assert doc["status"] == "failed" and doc["exit_code"] == 3, doc
    log = run_log(gpucloud_home, run_id)
    starts = resumed_at(log)
    assert len(starts) == 2 and starts[0] == 0 and 0 < starts[1] < N, (starts, log[-3000:])
    assert "preemption notice: Scheduled Events: Preempt" in log, log[-3000:]
    assert f"preempted at {starts[1]}" in log  # the job in the container had its SIGTERM and grace
    assert " restored into ckpt" in log, log[-3000:]
    assert log.count("stage container_pull") == 2 and log.count("input-line-42") == 2
    assert log.count(f"run={run_id} rank=0 nodes=1 gpu=cdi-all path=/bin\n") == 2, log[-3000:]
    assert "token=***" in log and SECRET not in log and SECRET not in err
    assert hashlib.sha256(SECRET.encode()).hexdigest() in log
    assert f"done {N}" in log
    art = Path.cwd() / "gpucloud-runs" / run_id / "out"
    assert (art / "count.txt").read_text() == str(N) and (art / "result.txt").read_text() == f"result of {run_id}\n"
    run = Store(gpucloud_home / "state.db").get_run(run_id)
    assert run.status == "failed" and len(run.attempts) == 2, run
    assert run.attempts[0].end_reason.startswith("preempted"), run.attempts[0].end_reason
    azure_sim.wait_idle(30)
    assert leftovers(arm) == [] and azure_sim.leftover_processes() == []
    assert containers_of(run_id) == []
    print(f"\nAzure container spot job, evicted once at {starts[1]}/{N}, exit 3: {took:.1f}s")
