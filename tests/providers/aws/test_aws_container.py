"""`container:` on the AWS simulator (moto + simulated GPU machines, tests/support/aws_sim.py) with the
real podman and registry: a spot T4 job counting in its busybox image is preempted twice with
`gpucloud preempt`, resumes from its checkpoint on each new machine and finishes; the GPUs reach the
container through a CDI spec (one written here: its device `all` injects a variable, which podman
applies for real); no container and no machine is left. The guests' host stack finds the NVIDIA
container toolkit present (a stub nvidia-ctk: this machine has no network for its apt source)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucloud.vm.agent import container
from tests.providers.aws.test_aws_e2e import aws_env, wait_until  # noqa: F401
from tests.providers.local.test_local_containers import containers_of, count_job
from tests.run.test_spot import check_finished_count, preempted_twice
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.containers import ContainerLab, container_lab  # noqa: F401
from tests.support.moto_server import Moto, moto, moto_server, tagged_alive  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
CDI_SPEC = """\
cdiVersion: "0.5.0"
kind: nvidia.com/gpu
devices:
  - name: all
    containerEdits:
      env:
        - GPUCLOUD_TEST_GPU=cdi-all
"""


NVIDIA_CTK = """#!/bin/sh
case "$1" in
  --version) echo "NVIDIA Container Toolkit CLI version 1.17.8" ;;
  runtime) cfg=${4#--config=}; mkdir -p "$(dirname "$cfg")"; echo '{"runtimes": {"nvidia": {}}}' > "$cfg" ;;
  *) exit 2 ;;
esac
"""


@pytest.fixture
def toolkit_present(aws_sim: AwsVmSimulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The guests' PATH gets a stub nvidia-ctk, as on an image that has the container toolkit."""
    tools = tmp_path / "ctk"
    tools.mkdir()
    (tools / "nvidia-ctk").write_text(NVIDIA_CTK)
    (tools / "nvidia-ctk").chmod(0o755)
    plain = aws_sim.guest_env

    def guest_env(sandbox: Path, gpu: str, count: int) -> dict[str, str]:
        return {**plain(sandbox, gpu, count), "PATH": f"{tools}:{os.environ.get('PATH', '/usr/bin:/bin')}"}

    monkeypatch.setattr(aws_sim, "guest_env", guest_env)


@pytest.fixture
def cdi_spec() -> Iterator[Path]:
    """The machine's GPUs described for podman, as `nvidia-ctk cdi generate` would leave them."""
    if container.cdi_has_nvidia():
        pytest.skip("this machine has a CDI spec for NVIDIA GPUs already")
    out = Path(container.CDI_OUT)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(CDI_SPEC)
    yield out
    out.unlink(missing_ok=True)


def test_aws_spot_container_job_preempted_twice_resumes_and_finishes(
    aws_env: dict[str, str],  # noqa: F811
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    gpucloud_home: Path,
    container_lab: ContainerLab,  # noqa: F811
    cdi_spec: Path,
    toolkit_present: None,
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
