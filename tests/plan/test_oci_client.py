"""The plan's registry client (gpucloud/plan/oci_client.py) against real registries: Debian's
docker-registry on 127.0.0.1 (open, and with htpasswd auth), a small server of the test's own that
speaks the Bearer token flow and serves an OCI index, and a port that never answers (time budget)."""

from __future__ import annotations

import time

import pytest

from gpucloud.plan.oci_client import ImageConfig, Unknown, cuda_of, endpoint, read_config
from gpucloud.spec.container import parse_image_ref
from tests.support.containers import ContainerLab
from tests.support.token_registry import TOKEN, TokenRegistry, silent_registry, token_registry


def test_open_registry_gives_the_pushed_image_config(container_lab: ContainerLab) -> None:
    got = read_config(parse_image_ref(container_lab.image))
    assert isinstance(got, ImageConfig), got
    assert got.env["CUDA_VERSION"] == "12.4.1"
    assert got.labels["com.nvidia.cuda.version"] == "12.4.1"
    assert got.cuda == "12.4"
    assert "CUDA_VERSION" in got.cuda_detail
    assert got.manifest_digest.startswith("sha256:")


def test_htpasswd_registry_is_unknown_without_a_login(container_lab: ContainerLab) -> None:
    got = read_config(parse_image_ref(container_lab.private_image))
    assert isinstance(got, Unknown)
    assert "asks for a login" in got.reason


def test_htpasswd_registry_answers_the_jobs_login(container_lab: ContainerLab) -> None:
    reg = container_lab.auth_registry
    got = read_config(parse_image_ref(container_lab.private_image), login=(reg.username, reg.password))
    assert isinstance(got, ImageConfig), got
    assert got.cuda == "12.4"
    wrong = read_config(parse_image_ref(container_lab.private_image), login=(reg.username, "not-it"))
    assert isinstance(wrong, Unknown)
    assert "login was refused" in wrong.reason and "not-it" not in wrong.reason


def test_missing_tag_is_unknown_with_404(container_lab: ContainerLab) -> None:
    host = container_lab.open_registry.host
    got = read_config(parse_image_ref(f"{host}/team/train:nope"))
    assert isinstance(got, Unknown)
    assert "HTTP 404" in got.reason and "team/train:nope" in got.reason


def test_bearer_challenge_is_answered_with_an_anonymous_token_and_the_index_resolved() -> None:
    with token_registry(TokenRegistry()) as reg:
        got = read_config(parse_image_ref(f"{reg.host}/team/train:1.0"))
    assert isinstance(got, ImageConfig), got
    assert got.cuda == "12.6"  # the linux/amd64 entry, not the arm64 one listed first (CUDA_VERSION=9.9)
    assert reg.token_queries == ["service=test-registry&scope=repository%3Ateam%2Ftrain%3Apull"]
    first, *rest = reg.seen
    assert first == ("/v2/team/train/manifests/1.0", "")  # anonymous first
    assert all(auth == f"Bearer {TOKEN}" for path, auth in rest if path != "/token")
    assert [p for p, _ in rest if p.startswith("/v2/")][-1].startswith("/v2/team/train/blobs/sha256:")


def test_a_config_that_does_not_match_its_digest_is_refused() -> None:
    with token_registry(TokenRegistry(bad_config_digest=True)) as reg:
        got = read_config(parse_image_ref(f"{reg.host}/team/train:1.0"))
    assert isinstance(got, Unknown)
    assert "does not match its digest" in got.reason


def test_a_registry_that_never_answers_is_unknown_within_the_budget() -> None:
    with silent_registry() as host:
        start = time.monotonic()
        got = read_config(parse_image_ref(f"{host}/team/train:1.0"))
        took = time.monotonic() - start
    assert isinstance(got, Unknown)
    assert "did not answer" in got.reason or "timed out" in got.reason
    assert 2.5 < took < 3.6


def test_nothing_listening_is_unknown_at_once() -> None:
    with silent_registry() as host:
        pass  # closed: the port refuses
    start = time.monotonic()
    got = read_config(parse_image_ref(f"{host}/team/train:1.0"))
    assert isinstance(got, Unknown) and "could not be reached" in got.reason
    assert time.monotonic() - start < 1.0


@pytest.mark.parametrize(
    ("env", "labels", "cuda"),
    [
        ({"CUDA_VERSION": "12.6.1"}, {}, "12.6"),
        ({"CUDA_VERSION": "12.6.0.022"}, {}, "12.6"),  # NGC images carry a build number
        ({}, {"com.nvidia.cuda.version": "11.8.0"}, "11.8"),
        ({"NVIDIA_REQUIRE_CUDA": "cuda>=13.0 brand=tesla,driver>=535"}, {}, "13.0"),
        ({"PATH": "/bin"}, {}, None),
        ({"CUDA_VERSION": "latest"}, {}, None),
    ],
)
def test_cuda_of_reads_nvidias_conventions(env: dict[str, str], labels: dict[str, str], cuda: str | None) -> None:
    assert cuda_of(env, labels)[0] == cuda


def test_endpoints_are_https_except_on_this_machine() -> None:
    assert endpoint("nvcr.io") == "https://nvcr.io"
    assert endpoint("docker.io") == "https://registry-1.docker.io"
    assert endpoint("127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert endpoint("localhost:5000") == "http://localhost:5000"
    assert endpoint("[::1]:5000") == "http://[::1]:5000"
    assert endpoint("myacr.azurecr.io") == "https://myacr.azurecr.io"
