"""`gpucloud image build` of a `container:` job on the AWS simulator with the real podman and a real
registry: the builder pulls the job's image into the disk it snapshots (its marker runs on the machine,
not in the image), the baked image's stack hash names the container image, `plan` picks it for that job
only, and a run from it starts with the registry gone: nothing is pulled again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.aws_runs import aws_env, hooked_cli  # noqa: F401
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.container_gpu import cdi_spec, toolkit_present  # noqa: F401
from tests.support.container_jobs import containers_of
from tests.support.containers import ContainerLab, container_lab, podman, start_registry  # noqa: F401
from tests.support.moto_server import Moto, moto, moto_server, tagged_alive  # noqa: F401

# every test here runs a GPU container: the CDI spec and a toolkit on PATH (tests/support/container_gpu.py)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.usefixtures("cdi_spec", "toolkit_present"),
]


def _job(folder: Path, image: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    job = folder / "job.yaml"
    job.write_text(
        "name: baked-box\nresources:\n  cloud: aws\n  regions: [us-east-1]\n  gpu: T4:1\n"
        f"container: {image}\nmax_duration: 15m\nrun: echo in-the-image; cat /proc/1/cmdline | tr '\\\\0' ' '\n"
    )
    return job


def test_image_build_prepulls_the_container_and_the_run_needs_no_registry(
    aws_env: dict[str, str],  # noqa: F811
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    container_lab: ContainerLab,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in aws_env.items() if k != "GPUCLOUD_TEST_AWS_RECORD"}
    registry = start_registry(tmp_path / "reg")
    try:
        image = registry.push(container_lab.local_image, "bake/train", "1")
        podman("rmi", "-f", image)  # the engine holds it only once the builder has pulled it
        job = _job(tmp_path / "job", image)
        built = hooked_cli(
            env, "image", "build", str(job), "--cloud", "aws", "--region", "us-east-1", "--yes", "--json"
        )
        assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-4000:]
        doc = json.loads(built.stdout.strip().splitlines()[-1])
        assert doc["built"] is True and tagged_alive(moto) == []
        builder = aws_sim.guest(aws_sim.booted[-1])
        assert builder is not None and f"container: pulled {image}" in builder.console(), builder.console()[-3000:]
        assert containers_of("image-baked-box") == [] and podman("image", "exists", image).returncode == 0
        plan = json.loads(hooked_cli(env, "plan", str(job), "--json").stdout)
        assert plan["candidates"][0]["image"]["found_by"] == "baked"
        other = _job(tmp_path / "other", container_lab.image)  # another image: not this baked image
        assert (
            json.loads(hooked_cli(env, "plan", str(other), "--json").stdout)["candidates"][0]["image"]["found_by"]
            != "baked"
        )
    finally:
        registry.stop()
    run = hooked_cli(env, "run", str(job), "--json", timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    result = json.loads(run.stdout)
    log = (Path(env["GPUCLOUD_HOME"]) / "runs" / result["run_id"] / "log.txt").read_text()
    assert "is in this machine's image (baked with it): not pulled again" in log and "in-the-image" in log, log[-3000:]
    aws_sim.wait_idle(30)
    assert tagged_alive(moto) == [] and containers_of(result["run_id"]) == []
