"""The real Slurm cluster and its OpenSSH login node that the Slurm end-to-end tests share
(tests/support/slurm_cluster.py, tests/support/sshd.py), the CLI's environment for them and a job
file on the cluster's K80 partition."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support.slurm_cluster import SlurmCluster
from tests.support.sshd import SshdServer, SshLab


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    if os.geteuid() != 0:
        pytest.skip("the test cluster runs slurmd as root (dummy GPU device nodes, SlurmdUser=root)")
    # Outside pytest's own 0700 temp folder: a second Unix user (the `stranger` fixture) must reach
    # slurm.conf and munge's socket, as every user of a site does.
    folder = Path(tempfile.mkdtemp(prefix="gpucloud-slurm-"))
    folder.chmod(0o711)
    c = SlurmCluster(folder / "cluster").start()
    yield c
    c.stop()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def login(cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SshLab, SshdServer]]:
    lab = SshLab(tmp_path_factory.mktemp("ssh") / "lab")
    # Jobs inherit the login's PATH (sbatch exports the environment): the stub nvidia-smi is the nodes' too.
    server = lab.add_server("hpc-login", gpu=("Tesla K80", 2, 11441, "470.256.02", "11.4"), env=cluster.env())
    lab.add_server("old-login", gpu=("Tesla K80", 2, 11441, "460.32.03", "11.2"), env=cluster.env())
    yield lab, server
    lab.close()


@pytest.fixture
def cli_env(login: tuple[SshLab, SshdServer], gpucloud_home: Path) -> dict[str, str]:
    lab, _ = login
    env = {**os.environ, **lab.env(), "GPUCLOUD_HOME": str(gpucloud_home), "CI": "true", "PYTHONPATH": str(REPO)}
    env.pop("SLURM_CONF", None)  # the CLI reaches Slurm only through the login node
    return env


def job(tmp_path: Path, name: str, body: str, resources: str = "gpu: K80:1, partition: k80") -> Path:
    path = tmp_path / f"{name}.yaml"
    limit = "" if "max_duration" in body else "max_duration: 10m\n"  # the partitions' MaxTime is 60 min
    path.write_text(f"name: {name}\nresources: {{cloud: slurm, cluster: hpc-login, {resources}}}\n{limit}{body}")
    return path
