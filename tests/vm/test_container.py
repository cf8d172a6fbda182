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
from gpucloud.vm.agent.stage_api import StageEnv, StageFailed
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
        "pull": "missing",  # a host the user owns: an image already there is used
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
        "pull": "missing",
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


def test_init_flags_find_podmans_init_or_say_there_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Debian's podman beside docker.io gets tini, not catatonit: the static tini goes in by --init-path."""
    have: set[str] = set()
    monkeypatch.setattr(container.os, "access", lambda path, mode: path in have)
    monkeypatch.setattr(container, "CONTAINERS_CONFS", ())
    assert container.init_flags("docker", {}) == (["--init"], "")  # docker brings docker-init
    flags, why = container.init_flags("/usr/bin/podman", {})
    assert flags == [] and "catatonit" in why and "not reaped" in why
    have.add("/usr/bin/tini-static")
    assert container.init_flags("/usr/bin/podman", {}) == (["--init", "--init-path=/usr/bin/tini-static"], "")
    have.add("/usr/libexec/podman/catatonit")
    assert container.init_flags("/usr/bin/podman", {}) == (["--init"], "")  # podman's own default
    have.clear()
    conf = tmp_path / "containers.conf"
    conf.write_text('[containers]\ninit_path = "/opt/init"\n')
    assert container.init_flags("podman", {"CONTAINERS_CONF": str(conf)}) == (["--init"], "")  # the machine's say
    argv = container.step_argv(
        DOC, engine="podman", name="n", job_dir=Path("/j"), mounts=[], names=[], gpus=False, shell="sh",
        command="true", init=["--init", "--init-path=/usr/bin/tini-static"],
    )  # fmt: skip
    assert argv[2:6] == ["--rm", "--init", "--init-path=/usr/bin/tini-static", "--name"]


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


def _engine_env(folder: Path, logged: list[str]) -> StageEnv:
    return StageEnv(
        log=logged.append,
        vm_dir=folder,
        environ={"PATH": str(folder)},
        now=lambda: 0.0,
        sleep=lambda s: None,
        stopping=lambda: False,
    )


def _versioned(folder: Path, name: str, answer: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\necho '{answer}'\n")
    path.chmod(0o755)


@pytest.mark.parametrize(
    ("podman", "ctk", "gpus", "want", "why"),
    [
        ("podman version 5.4.2", "NVIDIA Container Toolkit CLI version 1.20.1", True, "podman", "podman 5.4.2 gives"),
        ("podman version 4.9.3", "NVIDIA Container Toolkit CLI version 1.20.1", True, "docker", "#1860"),
        ("podman version 4.9.3", "NVIDIA Container Toolkit CLI version 1.18.2", True, "podman", "through CDI"),
        ("podman version 3.4.4", "NVIDIA Container Toolkit CLI version 1.18.2", True, "docker", "has no CDI"),
        ("podman version 3.4.4", "", False, "podman", "daemonless"),
    ],
)
def test_one_engine_decision_with_its_reason(
    tmp_path: Path, podman: str, ctk: str, gpus: bool, want: str, why: str
) -> None:
    """podman where it can give the GPUs with the installed toolkit, else docker; one logged line."""
    _versioned(tmp_path, "podman", podman)
    _versioned(tmp_path, "docker", "Docker version 26.1.5")
    if ctk:
        _versioned(tmp_path, "nvidia-ctk", ctk)
    logged: list[str] = []
    assert container.pick_engine(_engine_env(tmp_path, logged), gpus) == str(tmp_path / want)
    assert len(logged) == 1 and logged[0].startswith(f"container engine: {want}: ") and why in logged[0]


def test_no_engine_that_fits_is_a_clear_failure(tmp_path: Path) -> None:
    logged: list[str] = []
    with pytest.raises(StageFailed, match="neither podman nor docker is on this machine"):
        container.pick_engine(_engine_env(tmp_path, logged), False)
    _versioned(tmp_path, "podman", "podman version 3.4.4")
    with pytest.raises(StageFailed, match="podman 3.4.4 has no CDI .*install docker"):
        container.pick_engine(_engine_env(tmp_path, logged), True)


def test_pull_progress_reads_podman_and_docker_output() -> None:
    podman = container.PullProgress()
    for line in (
        "Copying blob sha256:aaaaaaaaaaaaaaaa",
        "Copying blob sha256:bbbbbbbbbbbbbbbb",
        "Copying blob aaaaaaaaaaaa done   1.2MiB / 1.2MiB",
    ):
        podman.feed(line)
    assert podman.line("img", 12) == "container: pulling img: 1/2 layers done, 1.2MiB / 1.2MiB, 12 s"
    docker = container.PullProgress()
    for line in ("cccccccccccc: Pulling fs layer", "dddddddddddd: Already exists", "cccccccccccc: Pull complete"):
        docker.feed(line)
    assert "2/2 layers done" in docker.line("img", 3)


def test_pull_deadline_scales_with_the_image_size() -> None:
    assert container.pull_limit(None, 5000.0) == 5000.0  # unknown size: what the run's deadline leaves
    assert container.pull_limit(10**6, 5000.0) == container.PULL_MIN_S  # small: the floor
    assert container.pull_limit(20 * 10**9, 99999.0) == 20 * 10**9 / container.PULL_MIN_BPS  # 20 GB: 4000 s
    assert container.pull_limit(20 * 10**9, 300.0) == 300.0  # never past the run's deadline


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
    said = calls.read_text().splitlines() if calls.exists() else []
    assert set(said) <= {"--version"}  # the engine was only asked its version, never given the name
    for path in ["/data:/etc", "/a,b", "rel"]:
        with pytest.raises(StageFailed, match="cannot mount"):
            container.checked_mount(path)
