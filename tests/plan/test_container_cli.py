"""`gpucloud plan` for a `container:` job, in-process (typer's runner): the human plan shows the
image, its CUDA and the host stack with the reasons; `--json` has the `container` object; a GPU that
cannot run the image exits 2 naming the job file's line. The registry is the real docker-registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucloud.cli.app import app
from tests.support.container_jobs import write_container_job
from tests.support.containers import ContainerLab


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")


def test_plan_shows_the_container_and_the_host_stack(tmp_path: Path, container_lab: ContainerLab) -> None:
    res = CliRunner().invoke(app, ["plan", str(write_container_job(tmp_path, container_lab.image))])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert f"Container: {container_lab.image}, CUDA 12.4 (registry: CUDA_VERSION" in out
    assert "Host stack (#1): driver R580 (>= 550.54.14); engine: the image's docker" in out
    assert "driver: R580" in out and "natively" in out
    assert "Stack: driver" not in out  # the wheel/toolkit stack line of a host job is not shown


def test_plan_json_has_the_container_object(tmp_path: Path, container_lab: ContainerLab) -> None:
    res = CliRunner().invoke(
        app, ["plan", "--json", str(write_container_job(tmp_path, container_lab.image, cloud="azure"))]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)["container"]
    assert set(doc) == {
        "image",
        "registry",
        "cuda",
        "cuda_source",
        "cuda_detail",
        "size_bytes",
        "host_stack",
        "warnings",
    }
    assert (doc["cuda"], doc["cuda_source"]) == ("12.4", "registry")
    assert {"driver", "engine", "toolkit", "installs_if_missing"} <= set(doc["host_stack"])
    assert "docker.io" in doc["host_stack"]["installs_if_missing"]


def test_plan_of_a_k80_exits_2_at_the_container_line(tmp_path: Path, container_lab: ContainerLab) -> None:
    path = write_container_job(tmp_path, container_lab.image, gpu="K80:1")
    res = CliRunner().invoke(app, ["plan", str(path)])
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    assert f"{path}:5: container: K80 (Kepler) cannot run {container_lab.image} (CUDA 12.4)" in text
    assert "CUDA 12 dropped Kepler" in text and "Traceback" not in res.output


def test_private_image_is_read_with_the_login_secret(tmp_path: Path, container_lab: ContainerLab) -> None:
    reg = container_lab.auth_registry
    login = f"  login: {{username: {reg.username}, password_secret: REG_PASS}}\nsecrets: [REG_PASS]\n"
    path = tmp_path / "job.yaml"
    path.write_text(
        f"name: c\nresources: {{gpu: T4:1, cloud: aws}}\ncontainer:\n  image: {container_lab.private_image}\n"
        f"{login}run: x\n"
    )
    res = CliRunner().invoke(app, ["plan", "--json", "--secret", f"REG_PASS={reg.password}", str(path)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)["container"]
    assert (doc["cuda"], doc["cuda_source"]) == ("12.4", "registry")
    assert reg.password not in res.output
