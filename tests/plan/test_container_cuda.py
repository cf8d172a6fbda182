"""Which CUDA a `container:` image needs (gpucloud/plan/container.py): its tag, the NGC release table
(catalog/data/ngc_cuda.csv, each row sourced) and the order of the sources, with the registry real
(Debian's docker-registry) or a port that refuses."""

from __future__ import annotations

import re

import pytest

from gpucloud.plan.container import cuda_from_ngc_release, cuda_from_tag, image_cuda, ngc_table
from gpucloud.plan.stack_data import MIN_DRIVER
from gpucloud.spec.container import ContainerSpec, parse_image_ref
from tests.support.containers import ContainerLab

CLOSED = "127.0.0.1:1"  # nothing listens on port 1: the registry answers "could not be reached" at once


@pytest.mark.parametrize(
    ("image", "cuda"),
    [
        ("pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime", "12.1"),
        ("pytorch/pytorch:2.7.0-cuda12.8-cudnn9-devel", "12.8"),
        ("nvidia/cuda:12.6.1-base-ubuntu24.04", "12.6"),
        ("nvcr.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04", "12.4"),
        ("nvidia/cuda:11.8.0-cudnn8-devel-ubuntu22.04", "11.8"),
        ("team/train:cu121-py3", "12.1"),
        ("team/train:2.3-cu118", "11.8"),
        ("team/train:cuda-13.0", "13.0"),
        ("ubuntu:22.04", None),  # a leading version means CUDA only for nvidia/cuda
        ("team/train:1.0", None),
        ("team/cuda-tools:latest", None),
        ("team/train:accumulate12.1", None),  # "cuda" must start a part of the tag
    ],
)
def test_tag_names_the_cuda(image: str, cuda: str | None) -> None:
    found = cuda_from_tag(parse_image_ref(image))
    assert (found[0] if found else None) == cuda


def test_ngc_release_table_gives_the_release_cuda() -> None:
    found = cuda_from_ngc_release(parse_image_ref("nvcr.io/nvidia/pytorch:24.08-py3"))
    assert found is not None and found[0] == "12.6"
    assert "24.08" in found[1] and "ngc_cuda.csv" in found[1]
    assert cuda_from_ngc_release(parse_image_ref("nvcr.io/nvidia/pytorch:25.12-py3"))[0] == "13.1"  # type: ignore[index]
    assert cuda_from_ngc_release(parse_image_ref("nvcr.io/nvidia/pytorch:99.01-py3")) is None  # not in the table
    assert cuda_from_ngc_release(parse_image_ref("nvidia/pytorch:24.08-py3")) is None  # Docker Hub, not NGC


def test_every_ngc_row_is_a_known_cuda_with_a_source_mark() -> None:
    majors = {v.split(".")[0] for v in MIN_DRIVER}
    assert ngc_table(), "the table is empty"
    for (repo, release), (cuda, source) in ngc_table().items():
        assert repo.startswith("nvidia/") and re.fullmatch(r"\d{2}\.\d{2}", release), (repo, release)
        assert re.fullmatch(r"\d+\.\d+", cuda) and cuda.split(".")[0] in majors, (repo, release, cuda)
        assert re.match(r"\[(V|C|R)\] ", source), f"{repo} {release}: source needs a mark [V]/[C]/[R]: {source}"


def test_registry_first(container_lab: ContainerLab) -> None:
    got = image_cuda(ContainerSpec(image=container_lab.image))
    assert (got.cuda, got.source) == ("12.4", "registry")
    assert "CUDA_VERSION" in got.detail and not got.warnings


def test_tag_when_the_registry_cannot_be_reached() -> None:
    got = image_cuda(ContainerSpec(image=f"{CLOSED}/pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime"))
    assert (got.cuda, got.source) == ("12.1", "tag")
    assert "could not be reached" in got.detail and not got.warnings


def test_unknown_cuda_is_a_warning_not_an_error() -> None:
    got = image_cuda(ContainerSpec(image=f"{CLOSED}/team/plain:1.0"))
    assert (got.cuda, got.source) == (None, "unknown")
    assert len(got.warnings) == 1 and "which CUDA" in got.warnings[0] and "not checked" in got.warnings[0]


def test_private_registry_needs_the_login_secret_value(container_lab: ContainerLab) -> None:
    reg = container_lab.auth_registry
    spec = ContainerSpec.model_validate(
        {"image": container_lab.private_image, "login": {"username": reg.username, "password_secret": "REG_PASS"}}
    )
    without = image_cuda(spec)  # no value here: the registry is asked anonymously and says no
    assert without.source == "unknown" and "REG_PASS has no value here" in without.detail
    assert reg.password not in without.detail
    given = image_cuda(spec, {"REG_PASS": reg.password})
    assert (given.cuda, given.source) == ("12.4", "registry")


def test_a_login_for_another_registry_is_not_sent(container_lab: ContainerLab) -> None:
    reg = container_lab.auth_registry
    spec = ContainerSpec.model_validate(
        {
            "image": container_lab.private_image,
            "login": {"username": reg.username, "password_secret": "REG_PASS", "registry": "other.example.com"},
        }
    )
    got = image_cuda(spec, {"REG_PASS": reg.password})
    assert got.source == "unknown" and "asks for a login" in got.detail


def test_a_cpu_job_does_not_ask() -> None:
    got = image_cuda(ContainerSpec(image=f"{CLOSED}/team/plain:1.0"), gpu_job=False)
    assert got.source == "unknown" and got.cuda is None and not got.warnings and "CPU-only" in got.detail
