"""The container_pull stage with the real engines (Debian's docker.io and podman, tests/support/
containers.py): where podman is too old for CDI (a `podman --version` stub answering 3.4.4, Ubuntu
22.04's) a GPU job's image runs under docker and the log says why in one line; an image imported
on the machine (never pushed anywhere) runs with `pull: missing`; a missing one with `pull: never`
or a failed pull is ImageUnavailable (the run's exit 66), naming the image and the fix."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucloud.vm.agent import container
from gpucloud.vm.agent.stage_api import StageEnv
from tests.support.containers import ContainerLab, build_test_image, container_lab  # noqa: F401
from tests.support.procs import stop_process

pytestmark = pytest.mark.slow

LOCAL = "localhost/gpucloud-engines:1"


def _docker_ok(env: dict[str, str]) -> bool:
    try:
        return subprocess.run(["docker", "info"], env=env, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.fixture(scope="module")
def docker_env() -> Iterator[dict[str, str]]:
    """A docker daemon of this module's own (vfs storage, no bridge or iptables: the sandbox has neither)."""
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        pytest.skip("needs Debian's docker.io (dockerd and docker)")
    folder = Path(tempfile.mkdtemp(prefix="gpdk-"))
    sock = folder / "docker.sock"
    env = {**os.environ, "DOCKER_HOST": f"unix://{sock}"}
    argv = ["dockerd", "--storage-driver=vfs", "--iptables=false", "--bridge=none", f"--host=unix://{sock}"]
    argv += [f"--data-root={folder / 'data'}", f"--exec-root={folder / 'exec'}", f"--pidfile={folder / 'pid'}"]
    with open(folder / "dockerd.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while not _docker_ok(env):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc)
            pytest.skip("dockerd does not start here: " + (folder / "dockerd.log").read_text()[-300:])
        time.sleep(0.5)
    try:
        yield env
    finally:
        stop_process(proc)
        shutil.rmtree(folder, ignore_errors=True)


def _stub(folder: Path, name: str, answer: str) -> None:
    (folder / name).write_text(f"#!/bin/sh\necho '{answer}'\n")
    (folder / name).chmod(0o755)


def _env(tmp_path: Path, logged: list[str], environ: dict[str, str], stubs: Path | None = None) -> StageEnv:
    path = ([str(stubs)] if stubs else []) + [os.path.dirname(shutil.which("docker") or "/usr/bin/docker")]
    environ = {**environ, "PATH": ":".join(path + ["/usr/bin", "/bin", "/usr/sbin", "/sbin"])}
    return StageEnv(logged.append, tmp_path, environ, time.monotonic, time.sleep, lambda: False)


def _box(tmp_path: Path, doc: dict) -> container.Container:
    (tmp_path / "job").mkdir(exist_ok=True)
    return container.Container(doc, tmp_path, tmp_path / "job", "eng1", 0)


def test_podman_without_cdi_gives_the_gpu_job_to_docker_and_says_why(
    tmp_path: Path, docker_env: dict[str, str]
) -> None:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    _stub(stubs, "podman", "podman version 3.4.4")
    _stub(stubs, "nvidia-ctk", "NVIDIA Container Toolkit CLI version 1.18.2")
    tar = subprocess.run(["podman", "save", build_test_image(LOCAL)], capture_output=True, check=True).stdout
    subprocess.run(["docker", "load"], input=tar, env=docker_env, capture_output=True, check=True)
    logged: list[str] = []
    box = _box(tmp_path, {"image": LOCAL, "pull": "missing"})
    box.prepare(_env(tmp_path, logged, docker_env, stubs), {}, True, lambda: 120.0)
    assert os.path.basename(box.engine) == "docker"
    why = [line for line in logged if line.startswith("container engine:")]
    assert why == ["container engine: docker: podman 3.4.4 has no CDI (needs 4.1): docker gives the GPUs instead"]
    assert f"container: {LOCAL} is already on this machine: not pulled (pull: missing)" in logged
    command, _ = box.step("echo hi", "run", [], gpus=True)
    assert "--gpus all" in command and "nvidia.com/gpu" not in command


def test_an_image_imported_on_the_machine_runs_with_pull_missing_under_podman(
    tmp_path: Path,
    container_lab: ContainerLab,  # noqa: F811
) -> None:
    logged: list[str] = []
    box = _box(tmp_path, {"image": container_lab.local_image, "pull": "missing"})
    box.prepare(_env(tmp_path, logged, dict(os.environ)), {}, False, lambda: 120.0)
    assert os.path.basename(box.engine) == "podman" and box.shell == "sh"
    assert any(line.startswith("container engine: podman: podman ") for line in logged)
    assert not any("pulled" in line and "not pulled" not in line for line in logged)


@pytest.mark.parametrize(
    ("pull", "says"),
    [
        ("never", "is not on this machine and container.pull is `never`"),
        ("missing", "cannot pull localhost/gpucloud-absent:1: "),
    ],
)
def test_a_missing_image_is_its_own_failure_naming_the_image_and_the_fix(
    tmp_path: Path,
    container_lab: ContainerLab,  # noqa: F811
    pull: str,
    says: str,
) -> None:
    logged: list[str] = []
    box = _box(tmp_path, {"image": "localhost/gpucloud-absent:1", "pull": pull})
    with pytest.raises(container.ImageUnavailable) as exc:
        box.prepare(_env(tmp_path, logged, dict(os.environ)), {}, False, lambda: 60.0)
    message = str(exc.value)
    assert says in message and "container.pull" in message and "\n" not in message
    assert container.IMAGE_EXIT == 66


def test_a_pull_reports_progress_while_it_runs_and_reads_the_real_engines_output(
    tmp_path: Path,
    container_lab: ContainerLab,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slow engine (a stub printing podman's lines over ~2 s) gets timed progress lines; the real
    podman's pull output (from the lab registry) is read as layers."""
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "podman").write_text(
        "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'podman version 5.0.0'; exit 0; }\n"
        "echo 'Copying blob sha256:aaaaaaaaaaaaaaaa'; echo 'Copying blob sha256:bbbbbbbbbbbbbbbb'; sleep 1\n"
        "echo 'Copying blob aaaaaaaaaaaa done'; sleep 1; echo 'Writing manifest to image destination'\n"
    )
    (slow / "podman").chmod(0o755)
    monkeypatch.setattr(container, "PROGRESS_S", 0.4)
    logged: list[str] = []
    env = StageEnv(
        logged.append, tmp_path, {"PATH": f"{slow}:/usr/bin:/bin"}, time.monotonic, time.sleep, lambda: False
    )
    proc = container.follow_pull([str(slow / "podman"), "pull", "x"], env, 30.0, "x")
    notes = [line for line in logged if line.startswith("container: pulling x: ")]
    assert proc.returncode == 0 and len(notes) >= 3, logged
    assert "0/2 layers done" in notes[0] and "1/2 layers done" in notes[-1]
    ref = container_lab.open_registry.push(container_lab.local_image, "team/progress", "1")
    try:
        real = container.follow_pull(["podman", "pull", "--tls-verify=false", ref], env, 60.0, ref)
        seen = container.PullProgress()
        for line in real.stdout.splitlines():
            seen.feed(line)
        assert real.returncode == 0 and len(seen.layers) >= 1, real.stdout
    finally:
        subprocess.run(["podman", "rmi", "-f", ref], capture_output=True)


def test_the_real_dockers_pull_output_is_read_as_layers(
    tmp_path: Path,
    docker_env: dict[str, str],
    container_lab: ContainerLab,  # noqa: F811
) -> None:
    ref = container_lab.open_registry.push(container_lab.local_image, "team/docker-progress", "1")
    env = StageEnv([].append, tmp_path, docker_env, time.monotonic, time.sleep, lambda: False)
    real = container.follow_pull(["docker", "pull", ref], env, 60.0, ref)
    seen = container.PullProgress()
    for line in real.stdout.splitlines():
        seen.feed(line)
    assert real.returncode == 0 and seen.layers and all(seen.layers.values()), real.stdout
