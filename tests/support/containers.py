"""A real container engine and a real registry for the container tests (docs/CONTAINERS.md, "Tests").

Engine: Debian's podman, as root, with the `runc` runtime, cgroupfs and explicit ulimits (the default
crun fails on setrlimit/cgroups in this sandbox). The settings are a containers.conf of the test
session's own, named by CONTAINERS_CONF, which podman reads in every process it starts, gpucloud's
agent included; /etc is left alone.

Registry: Debian's `docker-registry` (the reference Distribution registry) on 127.0.0.1, plain HTTP
(engines treat a registry on 127.0.0.0/8 as insecure by default, docker and podman with
`--tls-verify=false`), optionally with htpasswd (bcrypt) basic auth, so pulls, tags, digests and auth
are the real protocol. No outside registry is reachable: test images are made here, a busybox rootfs
imported with `podman import` (ENV lines as `--change`), then pushed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.procs import stop_process

CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
BUSYBOX_TOOLS = (
    "sh",
    "echo",
    "cat",
    "ls",
    "sleep",
    "env",
    "mkdir",
    "sha256sum",
    "nc",
    "test",
    "grep",
    "cp",
    "head",
    "wc",
    "dd",
    "date",
    "true",
    "false",
    "kill",
    "trap",
    "printf",
    "rm",
    "id",
    "touch",
)


def engine_problem() -> str | None:
    """Why the container tests cannot run here, or None (CI installs everything: .ci/run)."""
    for tool in ("podman", "runc", "docker-registry", "busybox", "htpasswd"):
        if shutil.which(tool) is None:
            return (
                f"{tool} is not installed (.ci/run installs podman, runc, docker-registry, busybox-static, "
                "apache2-utils)"
            )
    if os.geteuid() != 0:
        return "podman runs as root here"
    return None


def require_engine() -> None:
    """Skip outside CI when the engine is missing; in CI a missing engine is a failure, not a skip."""
    problem = engine_problem()
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(problem)
    pytest.skip(problem)


def use_test_engine_conf(folder: Path) -> Path:
    """Write the session's containers.conf and point CONTAINERS_CONF at it (this process and its children)."""
    conf = folder / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    os.environ["CONTAINERS_CONF"] = str(conf)
    return conf


def podman(*args: str, stdin: bytes | None = None, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(["podman", *args], input=stdin, capture_output=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    return proc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Registry:
    """One running registry: `host` is what an image reference starts with (127.0.0.1:PORT)."""

    host: str
    proc: subprocess.Popen[bytes]
    folder: Path
    username: str = ""
    password: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def ref(self, repo: str, tag: str) -> str:
        return f"{self.host}/{repo}:{tag}"

    def push(self, local: str, repo: str, tag: str) -> str:
        """Push a local image as host/repo:tag (logging in first when the registry asks for it)."""
        ref = self.ref(repo, tag)
        creds = [f"--creds={self.username}:{self.password}"] if self.username else []
        podman("push", "--tls-verify=false", *creds, local, ref)
        return ref

    def stop(self) -> None:
        stop_process(self.proc)


def start_registry(folder: Path, *, username: str = "", password: str = "") -> Registry:
    """docker-registry on a free 127.0.0.1 port, its storage under `folder`; with a user, htpasswd auth."""
    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    auth = ""
    if username:
        hashed = subprocess.run(
            ["htpasswd", "-Bbn", username, password], capture_output=True, text=True, check=True
        ).stdout
        (folder / "htpasswd").write_text(hashed)
        auth = f"auth:\n  htpasswd:\n    realm: gpucloud-test\n    path: {folder / 'htpasswd'}\n"
    config = folder / "config.yml"
    config.write_text(
        "version: 0.1\n"
        f"storage:\n  filesystem:\n    rootdirectory: {folder / 'data'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
        "log:\n  level: warn\n" + auth
    )
    log = open(folder / "registry.log", "wb")  # noqa: SIM115 - kept open for the server's life
    proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2).close()
            break
        except urllib.error.HTTPError as exc:  # 401 from an auth registry: it is up
            if exc.code == 401:
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc)
            raise AssertionError(f"docker-registry did not start: {(folder / 'registry.log').read_text()[-2000:]}")
        time.sleep(0.1)
    return Registry(f"127.0.0.1:{port}", proc, folder, username, password)


def build_test_image(
    name: str, *, env: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None, workdir: str = "/"
) -> str:
    """A busybox image named `name` (e.g. localhost/gpucloud-test:1) made with `podman import`; returns it.

    The rootfs is the host's static busybox with the tools the tests' jobs use linked to it, and /tmp.
    `env` and `labels` become the image config's Env and Labels (what gpucloud reads from a registry).
    """
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "rootfs"
        (root / "bin").mkdir(parents=True)
        (root / "tmp").mkdir()
        (root / "tmp").chmod(0o1777)
        shutil.copy2(shutil.which("busybox") or "/bin/busybox", root / "bin" / "busybox")
        for tool in BUSYBOX_TOOLS:
            (root / "bin" / tool).symlink_to("busybox")
        changes = ["--change", "ENV PATH=/bin"]
        for key, value in (env or {}).items():
            changes += ["--change", f"ENV {key}={value}"]
        for key, value in (labels or {}).items():
            changes += ["--change", f"LABEL {key}={value}"]
        changes += ["--change", f"WORKDIR {workdir}"]
        tar = subprocess.run(["tar", "-C", str(root), "-cf", "-", "."], capture_output=True, check=True).stdout
        podman("import", *changes, "-", name, stdin=tar)
    return name


@dataclass
class ContainerLab:
    """The engine configured, a plain registry and an auth registry, and one pushed test image on each."""

    open_registry: Registry
    auth_registry: Registry
    image: str  # on open_registry, ENV CUDA_VERSION=12.4.1
    private_image: str  # on auth_registry (needs username/password)
    local_image: str  # the local name both were pushed from


@pytest.fixture(scope="session")
def container_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContainerLab]:
    require_engine()
    folder = tmp_path_factory.mktemp("containers")
    use_test_engine_conf(folder)
    local = build_test_image(
        "localhost/gpucloud-test:1", env={"CUDA_VERSION": "12.4.1"}, labels={"com.nvidia.cuda.version": "12.4.1"}
    )
    open_reg = start_registry(folder / "open")
    auth_reg = start_registry(folder / "auth", username="gpucloud", password="pull-token-s3cret")
    try:
        image = open_reg.push(local, "team/train", "1.0")
        private = auth_reg.push(local, "private/train", "1.0")
        yield ContainerLab(open_reg, auth_reg, image, private, local)
    finally:
        open_reg.stop()
        auth_reg.stop()
