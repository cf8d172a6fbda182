"""`container:` on the AWS simulator (moto + simulated GPU machines, tests/support/aws_sim.py) with the
real podman and registry: a spot T4 job counting in its busybox image is preempted twice with
`gpucloud preempt`, resumes from its checkpoint on each new machine and finishes; the GPUs reach the
container through a CDI spec (one written here: its device `all` injects a variable, which podman
applies for real); no container and no machine is left. The guests' host stack finds the NVIDIA
container toolkit present (a stub nvidia-ctk: this machine has no network for its apt source,
tests/support/container_gpu.py). A 2-node containerised job meets over the hosts' network (both
guests on this host's loopback, so MASTER_PORT is a free port); an image the registry does not have
fails the node's container_pull stage within seconds (the run ends `error`, not at the deadline)
and no machine is left."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from tests.support.aws_runs import aws_env, hooked_cli  # noqa: F401
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.container_gpu import cdi_spec, toolkit_present  # noqa: F401
from tests.support.container_jobs import RENDEZVOUS, containers_of, count_job
from tests.support.containers import ContainerLab, container_lab  # noqa: F401
from tests.support.local_runs import write_job
from tests.support.moto_server import Moto, moto, moto_server, tagged_alive  # noqa: F401
from tests.support.polling import wait_until  # noqa: F401
from tests.support.spot_job import check_finished_count, preempted_twice

# every test here runs a GPU container: the CDI spec and a toolkit on PATH (tests/support/container_gpu.py)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.usefixtures("cdi_spec", "toolkit_present"),
]


def test_aws_spot_container_job_preempted_twice_resumes_and_finishes(
    aws_env: dict[str, str],  # noqa: F811
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    gpucloud_home: Path,
    container_lab: ContainerLab,  # noqa: F811
) -> None:
    n = 300
    resources = {"cloud": "aws", "regions": ["us-east-1"], "gpu": "T4:1", "spot": True}
    job = count_job(Path.cwd() / "job", container_lab.image, n, resources)
    text = job.read_text().replace("run: sh count.sh", 'run: echo "gpu=$GPUCLOUD_TEST_GPU"; sh count.sh')
    job.write_text(text)
    run_id, proc = preempted_twice(["tests.support.aws_cli", "run", str(job)], gpucloud_home, Path.cwd(), env=aws_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    check_finished_count(gpucloud_home, run_id, Path.cwd(), n, env=aws_env)
    log = (gpucloud_home / "runs" / run_id / "log.txt").read_text()
    assert log.count("gpu=cdi-all") == 3 and log.count("stage container_pull") == 3, log[-3000:]
    aws_sim.wait_idle(30)
    assert tagged_alive(moto, run_id) == [] and aws_sim.leftover_processes() == []
    assert containers_of(run_id) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_aws_two_containerised_nodes_rendezvous_over_the_hosts_network(
    aws_env: dict[str, str],  # noqa: F811
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    gpucloud_home: Path,
    container_lab: ContainerLab,  # noqa: F811
) -> None:
    port = _free_port()
    job = write_job(
        Path.cwd() / "job",
        {
            "name": "boxpair",
            "resources": {"cloud": "aws", "regions": ["us-east-1"], "gpu": "T4:1"},
            "num_nodes": 2,
            "container": container_lab.image,
            "env": {"MASTER_PORT": port},
            "max_duration": "5m",
            "run": 'echo "gpu=$GPUCLOUD_TEST_GPU"\n' + RENDEZVOUS,
        },
    )
    t0 = time.monotonic()
    proc = hooked_cli(aws_env, "run", str(job), "--json", timeout=240)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_id = json.loads(proc.stdout)["run_id"]
    log = (gpucloud_home / "runs" / run_id / "log.txt").read_text()
    assert "[node 0] rank0 got: hello from rank 1" in log, log[-3000:]
    assert f"[node 1] rank1 sent to 127.0.0.1:{port}" in log
    assert log.count("stage container_pull") == 2 and log.count("gpu=cdi-all") == 2, log[-3000:]
    guests = sorted(aws_sim.guests.values(), key=lambda g: g.meta["rank"])
    assert [g.meta["rank"] for g in guests] == ["0", "1"]
    aws_sim.wait_idle(30)
    assert tagged_alive(moto, run_id) == [] and aws_sim.leftover_processes() == []
    assert containers_of(run_id) == []
    print(f"\n2-node container rendezvous on simulated AWS: {took:.1f}s")


def test_aws_missing_image_fails_in_container_pull_quickly_and_leaves_no_machine(
    aws_env: dict[str, str],  # noqa: F811
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    gpucloud_home: Path,
    container_lab: ContainerLab,  # noqa: F811
) -> None:
    image = container_lab.open_registry.ref("team/missing", "9.9")
    job = write_job(
        Path.cwd() / "job",
        {
            "name": "noimage",
            "resources": {"cloud": "aws", "regions": ["us-east-1"], "gpu": "T4:1"},
            "container": image,
            "max_duration": "10m",
            "run": "echo never",
        },
    )
    t0 = time.monotonic()
    proc = hooked_cli(aws_env, "run", str(job), "--json", timeout=240)
    took = time.monotonic() - t0
    assert proc.returncode != 0 and took < 120, (took, proc.stderr[-4000:])
    run_id = json.loads(proc.stdout)["run_id"]
    message = " ".join(proc.stderr.split())
    assert f"container: cannot pull {image}:" in message and "manifest unknown" in message, message[-3000:]
    status = json.loads(hooked_cli(aws_env, "status", run_id, "--json").stdout)
    assert status["status"] == "error", status
    log = (gpucloud_home / "runs" / run_id / "log.txt").read_text()
    assert "pull 3/3" in log and "stage setup" not in log and "stage run" not in log, log[-3000:]
    aws_sim.wait_idle(30)
    assert tagged_alive(moto, run_id) == [] and aws_sim.leftover_processes() == []
    assert containers_of(run_id) == []
    print(f"\nmissing image on simulated AWS: failed after {took:.1f}s")
