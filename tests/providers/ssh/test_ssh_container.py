"""`container:` on a machine of the user's own (a real OpenSSH server on 127.0.0.1, tests/support/sshd.py)
with the real podman and registry: the main job of the local provider's test (input, env, masked
secret, artifact, checkpoint, its exit code) runs in the image there, and nothing is left."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import cli
from tests.support.container_jobs import SECRET, containers_of, main_job
from tests.support.containers import ContainerLab, container_lab  # noqa: F401
from tests.support.local_runs import write_job
from tests.support.sshd import SshLab, have_sshd

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not have_sshd(), reason="needs /usr/sbin/sshd and ssh")]


@pytest.fixture(scope="module")
def box_lab(tmp_path_factory: pytest.TempPathFactory, container_lab: ContainerLab) -> Iterator[SshLab]:  # noqa: F811
    lab = SshLab(tmp_path_factory.mktemp("sshbox") / "lab")
    lab.add_server("boxhost", env={"CONTAINERS_CONF": os.environ["CONTAINERS_CONF"]})  # the host's engine config
    yield lab
    lab.close()


def test_main_job_runs_in_its_image_on_an_ssh_host(
    box_lab: SshLab,
    container_lab: ContainerLab,
    gpucloud_home: Path,
    tmp_path: Path,  # noqa: F811
) -> None:
    env = {**os.environ, **box_lab.env(), "GPUCLOUD_HOME": str(gpucloud_home), "CI": "true", "BOX_TOKEN": SECRET}
    spec = main_job(tmp_path / "job", container_lab.image, 5, {"cloud": "ssh", "hosts": ["boxhost"]})
    res = cli("run", str(spec), cwd=tmp_path, env=env, timeout=180)
    assert res.returncode == 5, res.stdout + res.stderr
    out = res.stdout + res.stderr
    run_id = next(p.name for p in (gpucloud_home / "runs").iterdir())
    assert "steps run with sh" in out and "setup-in-image=yes" in out and "input-line-42" in out
    assert f"run={run_id} rank=0 nodes=1 epochs=2 path=/bin" in out
    assert "token=***" in out and SECRET not in out and hashlib.sha256(SECRET.encode()).hexdigest() in out
    assert "notice-dir-mounted" in out and "checkpoint 1 uploaded (end" in out
    assert (tmp_path / "gpucloud-runs" / run_id / "out" / "result.txt").read_text() == f"result of {run_id}\n"
    assert containers_of(run_id) == []
    box = box_lab.servers[0]
    assert not list((box.remote_root / "work").iterdir()), "teardown removes the work folder"


def test_an_image_of_the_host_runs_and_a_missing_one_exits_66(
    box_lab: SshLab,
    container_lab: ContainerLab,  # noqa: F811
    gpucloud_home: Path,
    tmp_path: Path,
) -> None:
    """On a host you own the default is `pull: missing`: an image imported there (`localhost/...`,
    never pushed) runs; an image nobody has ends the run with exit 66 (not 70, the code of bugs) and
    one line naming the image and the fix."""
    env = {**os.environ, **box_lab.env(), "GPUCLOUD_HOME": str(gpucloud_home), "CI": "true"}
    resources = {"cloud": "ssh", "hosts": ["boxhost"]}
    here = write_job(
        tmp_path / "here",
        {"name": "here", "resources": resources, "container": container_lab.local_image, "run": "echo ran-in-it"},
    )
    res = cli("run", str(here), cwd=tmp_path, env=env, timeout=180)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "ran-in-it" in out and "is already on this machine: not pulled (pull: missing)" in out
    absent = write_job(
        tmp_path / "absent",
        {"name": "no-image", "resources": resources, "container": "localhost/gpucloud-absent:1", "run": "true"},
    )
    res = cli("run", str(absent), cwd=tmp_path, env=env, timeout=180)
    out = res.stdout + res.stderr
    assert res.returncode == 66, out
    assert "cannot pull localhost/gpucloud-absent:1" in out and "container.pull: missing" in out
