"""The VM side of `container:` without an engine: the agent's container document built from the job
file, the step's engine argv (owned flags, GPU flags per engine, no value of the environment on
argv), the engine choice, and what a step's container is recorded as for the node's killers.
The real engine and registry: tests/providers/local/test_local_containers.py.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from gpucloud.contract.registry import capabilities
from gpucloud.spec.load import parse_spec
from gpucloud.vm.agent import container
from gpucloud.vm.agent.config import JobConfig
from gpucloud.vm.agent.stage_api import StageFailed
from gpucloud.vm.agent_config import job_config
from tests.support.render_inputs import CPU, make_candidate

JOB = """\
name: boxed
resources: {cloud: local}
run: python train.py
secrets: [NGC_KEY, HF_TOKEN]
container:
  image: nvcr.io/nvidia/pytorch:24.08-py3
  options: ["--shm-size=8g", "-v", "/scratch:/scratch"]
  user: "1000:1000"
  entrypoint: /bin/env
  login: {username: $oauthtoken, password_secret: NGC_KEY}
"""


def config_of(text: str) -> JobConfig:
    spec = parse_spec(text, "job.yaml")
    cfg = job_config(spec, CPU, make_candidate("local", ""), caps=capabilities("local"), run_id="r1")
    return JobConfig.from_mapping(json.loads(cfg.to_json()))  # as the node reads it


def test_job_json_carries_the_container_and_no_password() -> None:
    cfg = config_of(JOB)
    assert cfg.container == {
        "image": "nvcr.io/nvidia/pytorch:24.08-py3",
        "options": ["--shm-size=8g", "-v", "/scratch:/scratch"],
        "user": "1000:1000",
        "entrypoint": "/bin/env",
        "login": {"registry": "nvcr.io", "username": "$oauthtoken", "password_secret": "NGC_KEY"},
        "sealed_login": True,  # the node waits for the login, sealed with the secrets
        "prepulled": False,  # not a machine image baked with this container
        "pull_only": False,  # not the image builder
    }
    assert cfg.secrets == ["NGC_KEY", "HF_TOKEN"]  # the password arrives sealed, as a secret


def test_shorthand_image_is_normalised_and_no_container_is_empty() -> None:
    cfg = config_of("name: s\nresources: {cloud: local}\nrun: 'true'\ncontainer: ubuntu\n")
    public = {
        "image": "docker.io/library/ubuntu:latest",
        "options": [],
        "user": "",
        "entrypoint": "",
        "prepulled": False,
        "pull_only": False,
    }
    assert cfg.container == {**public, "sealed_login": False}
    ecr = config_of(
        "name: s\nresources: {cloud: local}\nrun: 'true'\n"
        "container: 123456789012.dkr.ecr.us-east-1.amazonaws.com/team/train:1\n"
    )
    assert ecr.container["sealed_login"] is True and "login" not in ecr.container  # the CLI's pull token
    acr = config_of("name: s\nresources: {cloud: local}\nrun: 'true'\ncontainer: myteam.azurecr.io/train:1\n")
    assert acr.container["sealed_login"] is True and "login" not in acr.container  # the CLI's ACR token
    login_elsewhere = JOB.replace("password_secret: NGC_KEY}", "password_secret: NGC_KEY, registry: r.example:5000}")
    assert config_of(login_elsewhere).container["login"]["registry"] == "r.example:5000"
    assert config_of("name: s\nresources: {cloud: local}\nrun: 'true'\n").container == {}


DOC = {"image": "127.0.0.1:5000/team/train:1.0", "options": ["--shm-size=1g"], "user": "", "entrypoint": ""}


def argv_for(engine: str, doc: dict | None = None, gpus: bool = False) -> list[str]:
    return container.step_argv(
        doc or DOC,
        engine=engine,
        name="gpucloud-r1-0-run",
        job_dir=Path("/w/job"),
        mounts=["/w/notice", "/data"],
        names=["GPUCLOUD_RUN_ID", "HF_TOKEN", "MASTER_ADDR"],
        gpus=gpus,
        shell="sh",
        command="echo $HF_TOKEN; exit 3",
    )


def test_step_argv_owned_flags_then_the_users() -> None:
    argv = argv_for("/usr/bin/podman")
    assert argv == [
        "/usr/bin/podman", "run", "--rm", "--init", "--name", "gpucloud-r1-0-run", "--network", "host",
        "--ipc", "host", "-v", "/w/job:/w/job", "-v", "/w/notice:/w/notice", "-v", "/data:/data",
        "-w", "/w/job", "--env", "GPUCLOUD_RUN_ID", "--env", "HF_TOKEN", "--env", "MASTER_ADDR",
        "--shm-size=1g", "127.0.0.1:5000/team/train:1.0", "sh", "-c", "echo $HF_TOKEN; exit 3",
    ]  # fmt: skip
    with_user = argv_for("docker", {**DOC, "user": "1000", "entrypoint": "/entry.sh"})
    assert with_user[-6:-4] == ["--user=1000", "--entrypoint=/entry.sh"]  # a value never read as a flag


def _before_options(argv: list[str]) -> list[str]:
    at = argv.index("--shm-size=1g")  # the user's options follow gpucloud's GPU flags
    return argv[at - 2 : at]


def test_gpu_flags_per_engine() -> None:
    assert _before_options(argv_for("/usr/bin/podman", gpus=True)) == ["--device", "nvidia.com/gpu=all"]
    assert _before_options(argv_for("/usr/local/bin/docker", gpus=True)) == ["--gpus", "all"]
    assert "--device" not in argv_for("podman") and "--gpus" not in argv_for("docker")


def test_no_value_of_the_environment_is_on_argv() -> None:
    names = container.env_names(
        {"GPUCLOUD_RUN_ID": "r1", "EPOCHS": "5"},
        {"HF_TOKEN": "hf_s3cr3t"},
        {"PATH": "/usr/bin", "HOME": "/root", "CUDA_VISIBLE_DEVICES": "1,2"},
    )
    assert names == ["CUDA_VISIBLE_DEVICES", "EPOCHS", "GPUCLOUD_RUN_ID", "HF_TOKEN"]  # not PATH, not HOME
    doc = {**DOC, "options": ["--label=x"]}
    argv = container.step_argv(
        doc, engine="podman", name="n", job_dir=Path("/j"), mounts=[], names=names, gpus=False, shell="sh",
        command="true",
    )  # fmt: skip
    assert not any("hf_s3cr3t" in a or "=5" in a or "1,2" in a for a in argv)
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--env"] == names


def test_names_tls_and_data_mounts() -> None:
    assert container.container_name("r-2024/x y", 1, "setup") == "gpucloud-r-2024-x-y-1-setup"
    assert container.loopback("127.0.0.1:5000") and container.loopback("localhost:5000")
    assert container.loopback("[::1]:5000") and not container.loopback("nvcr.io")
    assert container.tls_flags("/usr/bin/podman", "127.0.0.1:5000") == ["--tls-verify=false"]
    assert container.tls_flags("docker", "127.0.0.1:5000") == []  # docker allows 127.0.0.0/8 itself
    assert container.tls_flags("podman", "nvcr.io") == []
    grants = {"inputs": [{"dest": "/data/"}, {"dest": "rel"}], "outputs": [{"src": "/out"}, {"src": "out"}]}
    assert container.data_mounts(grants) == ["/data", "/out"]
    assert container.remove_argv("/usr/bin/podman", "n") == ["/usr/bin/podman", "rm", "-f", "--time", "0", "n"]
    assert container.remove_argv("/usr/bin/docker", "n") == ["/usr/bin/docker", "rm", "-f", "n"]


def _tool(folder: Path, name: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_engine_choice_podman_then_docker_else_a_clear_failure(tmp_path: Path) -> None:
    both, docker_only, none = tmp_path / "both", tmp_path / "docker", tmp_path / "none"
    for folder in (both, docker_only, none):
        folder.mkdir()
    _tool(both, "podman")
    _tool(both, "docker")
    _tool(docker_only, "docker")
    assert container.pick_engine(str(both)) == str(both / "podman")
    assert container.pick_engine(str(docker_only)) == str(docker_only / "docker")
    with pytest.raises(StageFailed, match="neither podman nor docker is on this machine"):
        container.pick_engine(str(none))


def test_recorded_container_is_removed_by_whoever_reads_it(tmp_path: Path) -> None:
    """The record names the engine and the container; removing it runs the engine's rm."""
    calls = tmp_path / "calls"
    engine = tmp_path / "podman"
    engine.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    engine.chmod(0o755)
    container.record(tmp_path, str(engine), "gpucloud-r1-0-run")
    assert container.recorded(tmp_path) == (str(engine), "gpucloud-r1-0-run")
    container.remove_recorded(tmp_path)
    assert calls.read_text() == "rm -f --time 0 gpucloud-r1-0-run\n"
    assert container.recorded(tmp_path) is None and not (tmp_path / container.RECORD).exists()
    container.remove_recorded(tmp_path)  # nothing recorded: nothing to do
    assert calls.read_text().count("\n") == 1


def test_cdi_spec_is_found_by_its_kind(tmp_path: Path) -> None:
    (tmp_path / "other.yaml").write_text("kind: example.com/fpga\n")
    assert not container.cdi_has_nvidia([str(tmp_path), str(tmp_path / "missing")])
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")
    assert container.cdi_has_nvidia([str(tmp_path)])
    assert os.path.basename(container.CDI_OUT) == "nvidia.yaml"


def test_the_image_builder_only_pulls_and_a_baked_machine_uses_what_it_holds() -> None:
    from gpucloud.plan.baked import stack_hash
    from gpucloud.plan.container import ImageCuda
    from gpucloud.plan.container_stack import container_stack
    from gpucloud.plan.images import resolve_node
    from gpucloud.vm.job_env import BUILDER_RUN, container_config

    builder = parse_spec(
        f"name: b\nresources: {{cloud: aws, gpu: T4}}\ncontainer: ubuntu:24.04\nrun: '{BUILDER_RUN}'\n", "job.yaml"
    )
    assert container_config(builder)["pull_only"] is True
    stacks = [container_stack("T4", None, ImageCuda(i, "docker.io", "12.6", "tag", "t")) for i in ("a:1", "b:1")]
    nodes = [resolve_node(s, "aws", "g4dn.xlarge", 1) for s in stacks]
    assert stack_hash(stacks[0], nodes[0]) != stack_hash(stacks[1], nodes[1])  # baked with a's image: a's jobs only
    baked = replace(nodes[0], image=replace(nodes[0].image, found_by="baked"))  # type: ignore[arg-type]
    assert container_config(builder, baked)["prepulled"] is True
    assert container_config(builder, nodes[0])["prepulled"] is False


@pytest.mark.parametrize(
    "image",
    ["docker.io/library/ubuntu:22.04", "127.0.0.1:5000/team/train:1.0", "[::1]:5000/x/y:z", "localhost/a_b__c-d",
     "nvcr.io/nvidia/pytorch:24.01-py3@sha256:" + "a" * 64, "ghcr.io/o/r@sha256:" + "0" * 64],
)  # fmt: skip
def test_image_references_in_the_oci_grammar_pass(image: str) -> None:
    assert container.checked_image(image) == image


def test_an_image_or_registry_that_reads_as_an_option_never_reaches_the_engine(tmp_path: Path) -> None:
    """`-eFOO=bar` as the image set a variable in the step's container (the spec's `-e` refusal
    bypassed): refused before the engine runs, as any other name outside the OCI grammar."""
    from gpucloud.vm.agent.stage_api import StageEnv

    calls = tmp_path / "calls"
    engine = tmp_path / "bin" / "podman"
    engine.parent.mkdir()
    engine.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexit 0\n')
    engine.chmod(0o755)
    env = StageEnv(
        log=lambda line: None, vm_dir=tmp_path, environ={"PATH": str(engine.parent)}, now=lambda: 0.0,
        sleep=lambda s: None, stopping=lambda: False,
    )  # fmt: skip
    for image in ["-eFOO=bar", "--privileged", "ubuntu -v /:/host", "team/UPPER", "a\nb", ""]:
        box = container.Container({"image": image}, tmp_path, tmp_path / "job", "r1", 0)
        with pytest.raises(StageFailed, match="is not an image reference"):
            box.prepare(env, {}, False, lambda: 60.0)
        with pytest.raises(StageFailed, match="is not an image reference"):
            argv_for("podman", {**DOC, "image": image})
    box = container.Container({"image": "127.0.0.1:5000/a:1"}, tmp_path, tmp_path / "job", "r1", 0)
    with pytest.raises(StageFailed, match="is not a registry host name"):
        box.prepare(env, {"server": "--tls-verify=false", "username": "u", "password": "p"}, False, lambda: 60.0)
    assert not calls.exists()  # the engine never ran
    for path in ["/data:/etc", "/a,b", "rel"]:
        with pytest.raises(StageFailed, match="cannot mount"):
            container.checked_mount(path)
