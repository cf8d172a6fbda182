"""Planning a `container:` job (gpucloud/plan/container_stack.py, container_plan.py, the planner):
a driver-only host stack (no wheel, no toolkit, no cuDNN; an engine and NVIDIA's container toolkit),
a GPU that cannot run the image refused with the reason (exit 2 naming the line of `container:`, or
an exclusion among alternatives), a driver raised when the image needs it, and `plan --json`'s
`container` object. The registry is the real docker-registry, or a port that refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucloud.errors import UserError
from gpucloud.plan.container import ImageCuda
from gpucloud.plan.container_stack import ImageRefused, container_stack
from gpucloud.plan.planner import make_plan
from gpucloud.plan.stack_data import CONTAINER_TOOLKIT_PACKAGES
from gpucloud.spec.load import StackSpec, load_spec
from tests.support.container_jobs import write_container_job
from tests.support.containers import ContainerLab

CLOSED = "127.0.0.1:1"


def image(cuda: str | None, source: str = "tag") -> ImageCuda:
    return ImageCuda("team/train:x", "docker.io", cuda, source, "test")


# ---- the host stack ---------------------------------------------------------------------------------


def test_t4_with_a_cuda12_image_plans_a_driver_only_host(tmp_path: Path, container_lab: ContainerLab) -> None:
    plan = make_plan(load_spec(write_container_job(tmp_path, container_lab.image)))
    stack = plan.stack
    assert (stack.gpu, stack.driver, stack.cuda, stack.cudnn, stack.framework) == ("T4", "580", "none", "none", "none")
    assert stack.cuda_packages == () and stack.cudnn_packages == () and stack.framework_pip == ()
    assert stack.driver_packages == ("cuda-drivers-580",) and not stack.cuda_toolkit
    assert stack.engine_packages == ("docker.io",) and stack.toolkit_packages == CONTAINER_TOOLKIT_PACKAGES
    assert stack.min_driver_version == MIN_12_4 and "natively" in stack.reasons["driver"]
    doc = json.loads(json.dumps(plan.as_json()))["container"]
    assert doc["image"] == container_lab.image and doc["registry"] == container_lab.open_registry.host
    assert (doc["cuda"], doc["cuda_source"]) == ("12.4", "registry")
    host = doc["host_stack"]
    assert host["driver"] == f"R580 (>= {MIN_12_4})"
    # aws's first T4 candidate boots the Deep Learning Base AMI, which has docker and the toolkit
    assert plan.candidates[0].image is not None and plan.candidates[0].image.name == "dlami-base-oss"
    assert "1.20.1" in host["image_has"] and host["engine"] == "the image's docker"
    assert doc["warnings"] == []


MIN_12_4 = "550.54.14"


def test_plain_ubuntu_gets_the_engine_and_the_pinned_toolkit(tmp_path: Path, container_lab: ContainerLab) -> None:
    plan = make_plan(load_spec(write_container_job(tmp_path, container_lab.image, cloud="azure")))
    host = plan.as_json()["container"]["host_stack"]  # type: ignore[index]
    assert plan.candidates[0].image is not None and plan.candidates[0].image.name == "ubuntu-22.04"
    assert host["image_has"] == ""
    installs = host["installs_if_missing"]
    assert "docker.io" in installs and "nvidia-container-toolkit=1.20.1-1" in installs
    assert not any(p.startswith(("cuda-toolkit", "cudnn", "libcudnn")) for p in installs)
    assert "nvidia-container-toolkit 1.20.1-1 from NVIDIA's repository" in host["toolkit"]


def test_k80_with_a_cuda12_image_is_refused_naming_the_line(tmp_path: Path, container_lab: ContainerLab) -> None:
    path = write_container_job(tmp_path, container_lab.image, gpu="K80:1")
    with pytest.raises(ImageRefused) as info:
        make_plan(load_spec(path))
    err = info.value
    assert err.exit_code == 2
    text = err.render()
    assert f"{path}:5: container: K80 (Kepler) cannot run {container_lab.image} (CUDA 12.4)" in text
    assert "CUDA 12 dropped Kepler" in text and "from registry" in text
    assert "CUDA 11.x" in (err.hint or "") and "Maxwell or newer GPU" in (err.hint or "")


def test_ngc_image_on_k80_says_what_to_pick() -> None:
    with pytest.raises(ImageRefused) as info:
        container_stack("K80", None, ImageCuda("nvcr.io/nvidia/pytorch:24.08-py3", "nvcr.io", "12.6", "ngc-table", "t"))
    want = "K80 (Kepler) cannot run nvcr.io/nvidia/pytorch:24.08-py3 (CUDA 12.6): CUDA 12 dropped Kepler"
    assert info.value.reason == want


@pytest.mark.parametrize(
    ("gpu", "cuda", "driver", "why"),
    [
        ("T4", "12.4", "580", "natively"),
        ("T4", "13.1", "590", "oldest branch that runs it"),  # 13.1 needs 590.44.01: raised
        ("T4", "13.2", "595", "oldest branch that runs it"),
        ("V100", "12.9", "580", "natively"),
        ("M60", "12.1", "580", "natively"),  # 12.1 is not in the table: 12.2's 535.54.03 bounds it
        ("K80", "11.8", "470", "minor-version compatibility"),  # 11.8 needs 520; R470 runs 11.x from 450.80.02
        ("K80", "11.4", "470", "natively"),
        ("H100", "10.2", "580", "every older CUDA"),
        ("T4", None, "580", "not checked"),
    ],
)
def test_the_driver_branch_runs_the_images_cuda(gpu: str, cuda: str | None, driver: str, why: str) -> None:
    stack = container_stack(gpu, None, image(cuda))
    assert stack.driver == driver and why in stack.reasons["driver"], stack.reasons["driver"]


@pytest.mark.parametrize(
    ("gpu", "cuda", "dropped"),
    [
        ("K80", "12.0", "CUDA 12 dropped Kepler"),
        ("K80", "13.0", "CUDA 12 dropped Kepler"),
        ("M60", "13.0", "CUDA 13 dropped Maxwell"),
        ("P100", "13.1", "CUDA 13 dropped Pascal"),
        ("V100", "13.0", "CUDA 13 dropped Volta"),
    ],
)
def test_an_architecture_the_cuda_major_dropped_is_refused(gpu: str, cuda: str, dropped: str) -> None:
    with pytest.raises(ImageRefused) as info:
        container_stack(gpu, None, image(cuda))
    assert dropped in info.value.reason


def test_a_gpu_newer_than_the_images_cuda_is_a_warning() -> None:
    stack = container_stack("H100", None, image("11.4"))
    assert any("newer than the image's CUDA 11.4" in w for w in stack.warnings)


@pytest.mark.parametrize(
    "pins",
    [
        {"framework": "pytorch"},
        {"framework": "pytorch==2.4.0"},
        {"cuda": "12.4"},
        {"cudnn": "9"},
        {"cuda_toolkit": True},
    ],
)
def test_stack_pins_of_what_the_image_brings_are_refused(pins: dict[str, object]) -> None:
    with pytest.raises(UserError) as info:
        container_stack("T4", StackSpec.model_validate(pins), image("12.4"))
    assert "with `container:` the image brings" in info.value.message


def test_a_driver_pin_must_reach_the_images_floor() -> None:
    assert container_stack("T4", StackSpec(driver="535"), image("12.4")).driver == "535"  # by compatibility
    assert container_stack("T4", StackSpec(driver="580"), image("13.2")).driver == "580"  # 13.x on >= 580
    with pytest.raises(UserError) as info:
        container_stack("T4", StackSpec(driver="470"), image("12.4"))
    assert "needs a driver >= 525.60.13" in info.value.message


# ---- alternatives, unknown CUDA, other providers -------------------------------------------------------


def test_alternatives_exclude_a_gpu_that_cannot_run_the_image(tmp_path: Path) -> None:
    spec = load_spec(write_container_job(tmp_path, f"{CLOSED}/team/train:cuda13.0", gpu="[M60:1, T4:1]", cloud="azure"))
    plan = make_plan(spec)
    assert {c.gpu for c in plan.candidates} == {"T4"}
    reasons = {e.reason for e in plan.excluded if e.instance_type.endswith("s_v3") and "_NV" in e.instance_type}
    assert any("M60 (Maxwell) cannot run" in r and "CUDA 13 dropped Maxwell" in r for r in reasons), reasons
    assert plan.as_json()["container"]["cuda_source"] == "tag"  # type: ignore[index]


def test_no_alternative_can_run_the_image(tmp_path: Path) -> None:
    path = write_container_job(tmp_path, f"{CLOSED}/team/train:cuda13.0", gpu="M60|V100-32GB", cloud="any")
    with pytest.raises(ImageRefused) as info:
        make_plan(load_spec(path))
    text = info.value.render()
    assert f"{path}:5: container: no GPU the job accepts can run the image" in text
    assert "CUDA 13 dropped Maxwell" in text and "CUDA 13 dropped Volta" in text


def test_unknown_cuda_plans_with_a_warning(tmp_path: Path) -> None:
    plan = make_plan(load_spec(write_container_job(tmp_path, f"{CLOSED}/team/plain:1.0")))
    doc = plan.as_json()["container"]
    assert doc["cuda"] is None and doc["cuda_source"] == "unknown"  # type: ignore[index]
    assert any("which CUDA" in w for w in plan.warnings)
    assert doc["warnings"] and plan.stack.driver == "580"  # type: ignore[index]


def test_local_provider_uses_the_host_as_it_is(tmp_path: Path) -> None:
    plan = make_plan(load_spec(write_container_job(tmp_path, f"{CLOSED}/team/train:cuda12.4", cloud="local")))
    host = plan.as_json()["container"]["host_stack"]  # type: ignore[index]
    assert host["installs_if_missing"] == [] and "as it is" in host["driver"]


def test_cpu_only_container_job_needs_only_an_engine(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(f"name: c\nresources: {{cloud: local}}\ncontainer: {CLOSED}/team/plain:1.0\nrun: x\n")
    plan = make_plan(load_spec(path))
    assert plan.stack.driver == "none" and plan.stack.engine_packages == ("docker.io",)
    assert plan.stack.toolkit_packages == () and not plan.warnings


def test_a_job_without_container_plans_as_before() -> None:
    from tests.support.planner_oracle import job

    doc = make_plan(job(gpu="T4:1", cloud=["aws"])).as_json()
    assert "container" not in doc
