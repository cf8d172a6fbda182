"""SSH hosts are probed for what they are: the OS in their os-release file decides NVIDIA's
repository path and the OS `plan` shows (docs/SSH.md, "Operating systems"). Real sshd servers on
127.0.0.1 (tests/support/sshd.py), each with its own os-release file and a stub nvidia-smi; the
driver "apt" means none until the stub apt-get installs it from a fake NVIDIA repository."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import cli
from tests.support.procs import gpucloud_until_started
from tests.support.sshd import SshLab
from tests.support.text import flat

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow

DEBIAN_12 = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\nID=debian\n'
UBUNTU_2404 = 'PRETTY_NAME="Ubuntu 24.04.1 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\nID=ubuntu\nID_LIKE=debian\n'
FEDORA_40 = 'NAME="Fedora Linux"\nVERSION_ID=40\nID=fedora\nPRETTY_NAME="Fedora Linux 40 (Server Edition)"\n'
NO_DRIVER_K40 = ("Tesla K40m", 1, 11441, "apt", "")
NO_DRIVER_T4 = ("Tesla T4", 1, 15360, "apt", "")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshLab]:
    lab = SshLab(tmp_path_factory.mktemp("ssh-os") / "lab")
    lab.add_server("deb12", gpu=NO_DRIVER_K40, os_release=DEBIAN_12)
    lab.add_server("noble", gpu=NO_DRIVER_T4, os_release=UBUNTU_2404)
    lab.add_server("fedora", gpu=NO_DRIVER_K40, os_release=FEDORA_40)
    lab.add_server("t4deb", gpu=("Tesla T4", 1, 15360, "535.104.05", "12.2"), os_release=DEBIAN_12)
    yield lab
    lab.close()


@pytest.fixture
def env(lab: SshLab, gpucloud_home: Path) -> dict[str, str]:
    return {
        **os.environ,
        **lab.env(),
        "GPUCLOUD_HOME": str(gpucloud_home),
        "CI": "true",
        "PYTHONPATH": str(REPO),
        "COLUMNS": "80",
    }


def job(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\n{body}")
    return path


@pytest.mark.parametrize(
    ("host", "gpu", "os_image", "repo"),
    [
        ("deb12", "K40:1", "debian-12", "debian12"),
        ("noble", "T4:1", "ubuntu-24.04", "ubuntu2404"),
    ],
)
def test_probe_and_plan_follow_the_hosts_os(
    env: dict[str, str], tmp_path: Path, host: str, gpu: str, os_image: str, repo: str
) -> None:
    probe = cli("hosts", "probe", host, "--gpu", gpu, cwd=tmp_path, env=env, timeout=180)
    assert probe.returncode == 78 and "no working NVIDIA driver" in flat(probe.stdout), probe.stdout + probe.stderr
    assert f"/{repo}/x86_64/cuda-keyring_1.1-1_all.deb" in flat(probe.stdout), probe.stdout
    assert f"OS {os_image}, NVIDIA repository {repo}" in flat(probe.stdout), probe.stdout
    assert "ubuntu2004" not in flat(probe.stdout) and "ubuntu2204" not in flat(probe.stdout)
    (doc,) = json.loads(cli("hosts", "probe", host, "--gpu", gpu, "--json", cwd=tmp_path, env=env, timeout=180).stdout)
    assert doc["nvidia_repo"] == repo and doc["stack"]["os_image"] == os_image
    spec = job(
        tmp_path,
        "onhost",
        f"resources: {{cloud: ssh, gpu: {gpu}, hosts: [{host}]}}\nstack: {{install: true}}\nrun: nvidia-smi\n",
    )
    plan = cli("plan", str(spec), cwd=tmp_path, env=env, timeout=180)
    assert plan.returncode == 0, plan.stderr
    assert f"OS image {os_image}" in plan.stdout + plan.stderr and "ubuntu-22.04" not in plan.stdout, plan.stdout
    assert (
        json.loads(cli("plan", str(spec), "--json", cwd=tmp_path, env=env, timeout=180).stdout)["stack"]["os_image"]
        == os_image
    )


def test_driver_install_uses_the_debian_repository(lab: SshLab, env: dict[str, str], tmp_path: Path) -> None:
    box = next(s for s in lab.servers if s.alias == "deb12")
    body = (
        "resources: {cloud: ssh, gpu: K40:1, hosts: [deb12]}\nstack: {install: true}\n"
        "run: nvidia-smi --query-gpu=name,driver_version --format=csv\n"
    )
    res = cli("run", str(job(tmp_path, "debinstall", body)), cwd=tmp_path, env=env, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Tesla K40m, 470.82.01" in res.stdout + res.stderr
    calls = (box.folder / "state" / "calls").read_text()
    assert "dpkg -i cuda-keyring_1.1-1_all.deb" in calls and "apt-get install -y cuda-drivers-470" in calls


def test_an_os_gpucloud_cannot_install_on_is_named_with_what_is_supported(env: dict[str, str], tmp_path: Path) -> None:
    probe = cli("hosts", "probe", "fedora", "--gpu", "K40:1", cwd=tmp_path, env=env, timeout=180)
    assert probe.returncode == 78, probe.stdout + probe.stderr
    supported = "gpucloud installs drivers only on Ubuntu 20.04, 22.04 or 24.04, or Debian 12"
    assert supported in flat(probe.stdout) and "OS fedora-40" in flat(probe.stdout), probe.stdout
    assert "apt-get" not in flat(probe.stdout) and "cuda-keyring" not in flat(probe.stdout), probe.stdout
    spec = job(
        tmp_path,
        "fedora",
        "resources: {cloud: ssh, gpu: K40:1, hosts: [fedora]}\nstack: {install: true}\nrun: nvidia-smi\n",
    )
    refused = cli("run", str(spec), cwd=tmp_path, env=env, timeout=180)
    assert refused.returncode == 2, refused.stderr
    assert "stack.install is true, but this host runs fedora-40" in flat(refused.stderr), refused.stderr
    assert "Traceback" not in refused.stderr


def test_unreachable_host_hint_is_valid_ssh(env: dict[str, str], tmp_path: Path) -> None:
    out = cli("hosts", "probe", "127.0.0.1:1", cwd=tmp_path, env=env, timeout=180)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    text = out.stdout + out.stderr
    assert "`ssh " in text and "-p 1 127.0.0.1 true`" in text and "ssh 127.0.0.1:1 true" not in text, text


SAVES_ON_TERM = """import os, signal, sys, time
def save(*_):
    os.makedirs("out", exist_ok=True)
    open("out/model.txt", "w").write("saved on SIGTERM\\n")
    print("saved", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
print("started", flush=True)
while True:
    time.sleep(0.1)
"""


def test_ctrl_c_on_a_host_brings_back_what_the_job_saved(lab: SshLab, env: dict[str, str], tmp_path: Path) -> None:
    """The host's folders go with the teardown, so the nodes are stopped first and read back."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text(SAVES_ON_TERM)
    spec = job(
        tmp_path / "code",
        "saver",
        "resources: {cloud: ssh, gpu: T4:1, hosts: [t4deb]}\nrun: python3 train.py\nartifacts: [out/]\n",
    )
    proc = gpucloud_until_started(["run", str(spec)], tmp_path, env=env)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    run_id = next(line.split("] run ", 1)[1].split()[0] for line in stderr.splitlines() if "] run " in line)
    assert (tmp_path / "gpucloud-runs" / run_id / "out" / "model.txt").read_text() == "saved on SIGTERM\n", stderr
    box = next(s for s in lab.servers if s.alias == "t4deb")
    assert not (box.remote_root / "work" / run_id).exists()  # torn down after it was read back
    log = cli("logs", run_id, cwd=tmp_path, env=env, timeout=180).stdout.splitlines()
    assert "saved" in log and log[-1] == f"[gpucloud] run {run_id} interrupted (exit 130): SIGINT received", log[-5:]
