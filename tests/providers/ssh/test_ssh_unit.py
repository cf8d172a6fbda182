"""The ssh provider's pure parts: host strings, the job file's `hosts`, probe parsing, the driver
verdict with its fix, and the ssh options (host-key policy, ssh -F). No sshd needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucloud.contract.provider import PlanRequest
from gpucloud.errors import UserError
from gpucloud.plan.requests import plan_request
from gpucloud.plan.stacks import resolve_stack
from gpucloud.providers.ssh import transport as ssh_transport
from gpucloud.providers.ssh.probe import assess, driver_problem, install_command, parse_probe
from gpucloud.providers.ssh.transport import SshHost
from gpucloud.spec.load import SpecError, StackSpec, parse_spec

K40_PROBE = """@root /home/alice/.gpucloud
@user alice
@os ubuntu 20.04 Ubuntu 20.04.6 LTS
@disk 52428800
@sudo no
@gpu 0, Tesla K40m, 11441, 470.182.03
@gpu 1, Tesla K40m, 11441, 470.182.03
@cuda 11.4
"""


@pytest.mark.parametrize(
    "text,user,host,port",
    [
        ("gpu-box", None, "gpu-box", None),
        ("alice@10.0.0.7:2222", "alice", "10.0.0.7", 2222),
        ("bob@[::1]:2200", "bob", "::1", 2200),
        ("devbox.lab.example", None, "devbox.lab.example", None),
    ],
)
def test_host_strings(text: str, user: str | None, host: str, port: int | None) -> None:
    parsed = SshHost.parse(text)
    assert (parsed.user, parsed.host, parsed.port) == (user, host, port)
    args = parsed.destination()
    assert args[-1] == host and ("-p" in args) == (port is not None) and ("-l" in args) == (user is not None)


def test_a_host_can_never_be_an_ssh_option() -> None:
    with pytest.raises(UserError):
        SshHost.parse("-oProxyCommand=touch /tmp/x")


def test_spec_hosts_only_with_cloud_ssh(tmp_path: Path) -> None:
    ok = parse_spec("name: a\nresources: {cloud: ssh, hosts: [gpu-box, 'alice@10.0.0.7:2222']}\nrun: x\n", "a.yaml")
    assert ok.resources.hosts == ["gpu-box", "alice@10.0.0.7:2222"] and ok.resources.gpu is None
    with pytest.raises(SpecError, match=r"a.yaml:3: resources.hosts: is only used with cloud: ssh"):
        parse_spec("name: a\nresources:\n  hosts: [gpu-box]\n  gpu: T4:1\nrun: x\n", "a.yaml")
    with pytest.raises(SpecError, match=r"a.yaml:4: resources.hosts\[1\]: '-oProxyCommand=x' is not a host"):
        parse_spec("name: a\nresources:\n  cloud: ssh\n  hosts: [ok, -oProxyCommand=x]\nrun: x\n", "a.yaml")
    with pytest.raises(SpecError, match="ssh cannot be combined with other clouds"):
        parse_spec("name: a\nresources: {cloud: [ssh, aws], gpu: T4:1}\nrun: x\n", "a.yaml")
    assert parse_spec("name: a\nstack: {install: true}\nresources: {cloud: ssh}\nrun: x\n", "a.yaml").stack.install


def asks(pins: StackSpec, gpu: str = "K40") -> PlanRequest:
    """What the planner passes for a one-node job on `gpu` with these stack pins."""
    job = parse_spec(f"name: a\nresources: {{cloud: ssh, gpu: {gpu}:1, hosts: [h]}}\nrun: x\n", "a.yaml")
    return plan_request(job.model_copy(update={"stack": pins}))


# `hosts probe` without --gpu: a job that names no GPU, the stack resolved as the planner does.
UNPINNED = PlanRequest(gpu=None, gpu_count=0, num_nodes=1, stack_for=resolve_stack)


def test_probe_parsing_and_kepler_stack() -> None:
    probe = assess(parse_probe("k40", K40_PROBE), "K40", 2, UNPINNED)
    assert [g.model for g in probe.gpus] == ["K40", "K40"] and probe.driver == "470.182.03"
    assert probe.disk_free_gib == 50.0 and probe.sudo == "no" and probe.cuda == "11.4"
    assert probe.stack is not None and (probe.stack.driver, probe.stack.cuda) == ("470", "11.4")
    assert probe.problems == []
    short = assess(parse_probe("k40", K40_PROBE), "K40", 4, UNPINNED)
    assert "has 2 x K40, the job asks for 4" in short.problems[0]


def test_driver_verdicts_name_the_fix() -> None:
    stack = resolve_stack("K40")
    new = parse_probe("k40", K40_PROBE.replace("470.182.03", "535.104.05"))
    assert "no longer supports Kepler" in (driver_problem(new, stack) or "")
    missing = parse_probe("k40", "@user alice\n@sudo no\n@smi-error nvidia-smi not found\n")
    verdict = driver_problem(missing, stack) or ""
    assert "no working NVIDIA driver" in verdict and "cuda-drivers-470" in verdict and "install: true" in verdict
    # install: true is honoured only where sudo works without a password.
    judged = assess(
        parse_probe("k40", "@user alice\n@sudo no\n@smi-error nvidia-smi not found\n"),
        "K40",
        1,
        asks(StackSpec(install=True)),
    )
    assert "no passwordless sudo" in judged.problems[0]
    allowed = assess(
        parse_probe("k40", "@user alice\n@sudo yes\n@smi-error nvidia-smi not found\n"),
        "K40",
        1,
        asks(StackSpec(install=True)),
    )
    assert allowed.problems == []
    assert install_command(stack, "root").count("sudo") == 0 and "ubuntu2004" in install_command(stack)


def test_old_driver_blocks_only_a_job_that_needs_the_resolved_cuda() -> None:
    t4 = "@user a\n@sudo no\n@gpu 0, Tesla T4, 15360, 535.104.05\n@cuda 12.2\n"
    plain = assess(parse_probe("t4", t4), "T4", 1, UNPINNED)
    assert plain.problems == [] and "older than" in plain.notes[0]
    pinned = assess(parse_probe("t4", t4), "T4", 1, asks(StackSpec(framework="pytorch"), "T4"))
    assert "older than" in pinned.problems[0]


def test_ssh_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.write_text("Host relaxed\n  StrictHostKeyChecking accept-new\n")
    monkeypatch.setenv("GPUCLOUD_SSH_CONFIG", str(cfg))
    monkeypatch.setenv("GPUCLOUD_SSH_CONTROL_DIR", "/tmp/gc-unit")
    strict = ssh_transport.base_args(SshHost.parse("plain"))
    assert strict[:2] == ["-F", str(cfg)] and "StrictHostKeyChecking=yes" in strict
    assert "ControlMaster=auto" in strict and "BatchMode=yes" in strict
    assert "StrictHostKeyChecking=yes" not in ssh_transport.base_args(SshHost.parse("relaxed"))
    monkeypatch.setenv("GPUCLOUD_SSH_CONFIG", str(tmp_path / "missing"))
    with pytest.raises(UserError, match="no such file"):
        ssh_transport.base_args(SshHost.parse("plain"))


def test_a_container_job_asks_an_ssh_host_for_the_images_driver_floor(tmp_path: Path) -> None:
    """`container:` on a host: the host's driver must reach the image's CUDA floor (not a host CUDA's),
    and a Kepler host cannot take a CUDA 12 image at all."""
    from gpucloud.plan.container import ImageCuda
    from gpucloud.plan.container_stack import ImageRefused
    from gpucloud.plan.requests import plan_request
    from gpucloud.spec.load import load_spec

    job = tmp_path / "job.yaml"
    job.write_text("name: c\nresources: {cloud: ssh, hosts: [box], gpu: T4}\ncontainer: img:1\nrun: 'true'\n")
    image = ImageCuda("img:1", "docker.io", "12.6", "tag", "test")
    req = plan_request(load_spec(job), image)
    stack = req.stack_for("T4")  # type: ignore[misc]
    assert req.needs_cuda and stack.min_driver_version == "560.28.03" and not stack.framework_pip
    old = parse_probe("t4", K40_PROBE.replace("Tesla K40m", "Tesla T4").replace("470.182.03", "535.104.05"))
    assert "older than 560.28.03" in (driver_problem(old, stack, needs_cuda=req.needs_cuda) or "")
    with pytest.raises(ImageRefused):
        req.stack_for("K40")  # type: ignore[misc]
