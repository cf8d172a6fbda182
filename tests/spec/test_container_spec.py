"""`container:` in the job file: the short and full forms, docker's reference grammar, the engine
options gpucloud owns, and a login whose password is not a listed secret (file, line and field)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucloud.spec.container import parse_image_ref
from gpucloud.spec.load import load_spec
from gpucloud.spec.values import SpecError

JOB = "name: c\nresources: {cloud: local}\nrun: echo hi\n"


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(JOB + body)
    return path


@pytest.mark.parametrize(
    ("ref", "expect"),
    [
        ("ubuntu", "docker.io/library/ubuntu:latest"),
        ("pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime", "docker.io/pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime"),
        ("127.0.0.1:5000/team/x:1", "127.0.0.1:5000/team/x:1"),
        ("localhost/x", "localhost/x:latest"),
        ("123456789012.dkr.ecr.us-east-1.amazonaws.com/team/train:1.4", None),
        ("nvcr.io/nvidia/pytorch@sha256:" + "a" * 64, None),
    ],
)
def test_references_follow_dockers_grammar(ref: str, expect: str | None) -> None:
    assert str(parse_image_ref(ref)) == (expect or ref)


def test_digest_is_the_manifest_reference() -> None:
    ref = parse_image_ref("nvcr.io/nvidia/pytorch:24.08-py3@sha256:" + "b" * 64)
    assert (ref.registry, ref.repository, ref.tag) == ("nvcr.io", "nvidia/pytorch", "24.08-py3")
    assert ref.reference == "sha256:" + "b" * 64


def test_short_and_full_forms(tmp_path: Path) -> None:
    short = load_spec(write(tmp_path, "container: nvcr.io/nvidia/pytorch:24.08-py3\n"))
    assert short.container is not None and short.container.image == "nvcr.io/nvidia/pytorch:24.08-py3"
    full = load_spec(
        write(
            tmp_path,
            "secrets: [NGC_API_KEY]\ncontainer:\n  image: nvcr.io/nvidia/pytorch:24.08-py3\n"
            '  options: ["--shm-size=8g"]\n  user: "1000:1000"\n'
            '  login: {username: "$oauthtoken", password_secret: NGC_API_KEY}\n',
        )
    )
    assert full.container is not None and full.container.options == ["--shm-size=8g"]
    assert full.container.registry == "nvcr.io"


@pytest.mark.parametrize(
    ("body", "line", "field", "text"),
    [
        ('container: {image: ubuntu, options: ["--gpus=all"]}\n', 4, "container.options", "set by gpucloud"),
        ('container: {image: ubuntu, options: ["-e", "A=1"]}\n', 4, "container.options", "`env:`"),
        ('container: "Nvidia/Pytorch:24 08"\n', 4, "container.image", "not an image reference"),
        ("container: {image: Nvidia/pytorch}\n", 4, "container.image", "not a repository name"),
        ("container: {image: ubuntu, user: 'a b'}\n", 4, "container.user", "is not a user"),
        ("container: {image: ubuntu, pull: sometimes}\n", 4, "container.pull", "missing"),
        ('container: {image: ubuntu, options: ["--pull=never"]}\n', 4, "container.options", "container.pull"),
        (
            "container:\n  image: ubuntu\n  login: {username: u, password_secret: TOKEN}\n",
            6,
            "container.login.password_secret",
            "TOKEN is not in secrets",
        ),
    ],
)
def test_errors_name_line_and_field(tmp_path: Path, body: str, line: int, field: str, text: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, body))
    message = " ".join(str(info.value).split())
    assert f"job.yaml:{line}: {field}:" in message and text in message, message


def test_plan_takes_a_container_job_on_every_provider(tmp_path: Path) -> None:
    """Every provider's node runs the agent, which runs the steps in the image: nothing is refused."""
    from gpucloud.contract import registry
    from gpucloud.plan.requests import refuse_what_providers_cannot_do

    spec = load_spec(write(tmp_path, "container: ubuntu:22.04\n"))
    assert refuse_what_providers_cannot_do(spec, list(registry.names()), None) is None
