"""What the VM renderer tests feed it: GPU and CPU stacks, hostile env values, a job spec and a
candidate, each with defaults a test overrides."""

from __future__ import annotations

import sys
from pathlib import Path

from gpucloud.contract.provider import Candidate
from gpucloud.plan.stacks import Stack
from gpucloud.spec.load import JobSpec

SHELLCHECK = Path(sys.executable).parent / "shellcheck"


K80 = Stack(
    gpu="K80",
    architecture="Kepler",
    compute_capability="3.7",
    driver="470",
    cuda="11.4",
    cudnn="8.2.4",
    os_image="ubuntu-20.04",
    framework="pytorch",
    framework_version="2.0.1",
    ubuntu_version="20.04",
    cuda_repo="ubuntu2004",
    driver_packages=("cuda-drivers-470",),
    cuda_packages=("cuda-toolkit-11-4",),
    cudnn_packages=("libcudnn8=8.2.4.*-1+cuda11.4",),
    framework_pip=("torch==2.0.1", "--index-url", "https://download.pytorch.org/whl/cu117"),
    min_driver_version="470.82.01",
    cuda_toolkit=True,  # the job asks for the system toolkit + cuDNN
)


T4 = Stack(
    gpu="T4",
    architecture="Turing",
    compute_capability="7.5",
    driver="580",
    cuda="12.8",
    cudnn="9",
    os_image="ubuntu-22.04",
    framework="pytorch",
    framework_version="2.7.1",
    ubuntu_version="22.04",
    cuda_repo="ubuntu2204",
    driver_packages=("cuda-drivers-580",),
    driver_lock=("nvidia-driver-pinning-580",),
    cuda_packages=("cuda-toolkit-12-8",),
    cudnn_packages=("cudnn9-cuda-12",),
    framework_pip=("torch==2.7.1", "--index-url", "https://download.pytorch.org/whl/cu128"),
    min_driver_version="570.26",
)


A100_TF = Stack(
    gpu="A100-80GB",
    architecture="Ampere",
    compute_capability="8.0",
    driver="580",
    cuda="12.8",
    cudnn="9",
    os_image="ubuntu-22.04",
    framework="tensorflow",
    framework_version="2.19.0",
    ubuntu_version="22.04",
    cuda_repo="ubuntu2204",
    driver_packages=("cuda-drivers-580",),
    driver_lock=("nvidia-driver-pinning-580",),
    cuda_packages=("cuda-toolkit-12-8",),
    cudnn_packages=("cudnn9-cuda-12",),
    framework_pip=("tensorflow==2.19.0",),
    min_driver_version="570.26",
)


CPU = Stack(
    gpu="none",
    architecture="none",
    compute_capability="",
    driver="none",
    cuda="none",
    cudnn="none",
    os_image="ubuntu-22.04",
    framework="none",
    framework_version=None,
    ubuntu_version="22.04",
    cuda_repo="ubuntu2204",
    driver_packages=(),
    cuda_packages=(),
    cudnn_packages=(),
    framework_pip=(),
    min_driver_version="",
)


NASTY = {
    "SUBST": "$(touch pwned)",
    "BACKTICK": "`touch pwned`",
    "SINGLE": "it's 'quoted'",
    "DOUBLE": 'say "hi" $HOME ${PATH}',
    "NEWLINES": "line1\nline2\n\n",
    "BACKSLASH": "a\\b\\\\c\\n\\'",
    "UNICODE": "naïve ☃ 日本語 \u200b",
    "SEMI": "x; touch pwned; echo",
    "EMPTY": "",
    "SPACES": "  lead and trail  ",
    "GLOB": "* ? [a-z] ~",
    "CR_TAB": "a\rb\tc",
}


def make_spec(
    *,
    cloud: str = "aws",
    gpu: str | None = "K80",
    count: int = 1,
    env: dict[str, str] | None = None,
    run: str = 'python3 train.py --epochs "$EPOCHS"',
    setup: str | None = "pip install -r requirements.txt",
    artifacts: list[str] | None = None,
    num_nodes: int = 1,
    max_duration: int = 3600,
) -> JobSpec:
    """A job of one K80 on AWS with an env value, a setup and artifacts, unless told otherwise."""
    resources: dict = {"cloud": [cloud]}
    if gpu:
        resources["gpu"] = {"model": gpu, "count": count}
    return JobSpec(
        name="job",
        resources=resources,
        env=env if env is not None else {"EPOCHS": "5"},
        run=run,
        setup=setup,
        artifacts=artifacts if artifacts is not None else ["outputs/", "metrics.json"],
        num_nodes=num_nodes,
        max_duration=max_duration,
    )


def make_candidate(
    cloud: str = "aws", gpu: str = "K80", count: int = 1, nodes: int = 1, instance_type: str = "p2.xlarge"
) -> Candidate:
    """An on-demand candidate at $0.90/h per node in us-east-1 (or the local machine)."""
    return Candidate(
        cloud=cloud,
        region="us-east-1" if cloud != "local" else "local",
        instance_type=instance_type,
        gpu=gpu,
        gpu_count=count,
        num_nodes=nodes,
        spot=False,
        price_per_hour=0.9,
        total_per_hour=0.9 * nodes,
        estimated_cost=0.9,
    )
