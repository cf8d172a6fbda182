"""CPUs, memory and autodetected GPU names against a real Slurm 22.05 that enforces what a job asks
for (tests/support/slurm_cluster.py with `enforced`: tasks bound to their CPUs by task/affinity,
memory consumable), whose gres.conf types its GPUs as `AutoDetect=nvml` does
(`nvidia_a100_80gb_pcie`), through the CLI and a real OpenSSH login node: a job's min_vcpus and
min_memory_gib reach the job (NumCPUs, memory in `scontrol show job`) and an srun of its own
(`nproc`); a partition of autodetected GPUs plans, and its two-node job gets the node's share of
CPUs for its GPUs inside the batch script's srun."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support.cli import cli
from tests.support.slurm_cluster import (
    SlurmCluster,
    have_slurm,
    missing,
    queue_empty_after,  # noqa: F401  (autouse, this cluster's)
)
from tests.support.sshd import SshLab, have_sshd
from tests.support.text import flat

pytestmark = [
    pytest.mark.skipif(not have_sshd(), reason="needs /usr/sbin/sshd and ssh (openssh-server)"),
    pytest.mark.skipif(
        not have_slurm(), reason=f"needs Slurm and munge (apt-get install slurm-wlm munge): {missing()}"
    ),
]

AUTODETECTED = "nvidia_a100_80gb_pcie"  # NVML's "NVIDIA A100 80GB PCIe", as AutoDetect=nvml types it


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    if os.geteuid() != 0:
        pytest.skip("the test cluster runs slurmd as root (dummy GPU device nodes, SlurmdUser=root)")
    folder = Path(tempfile.mkdtemp(prefix="gpucloud-slurm-enforced-"))
    c = SlurmCluster(folder / "cluster", gres_type=AUTODETECTED, partition="gpu", memory_mb=2048, enforced=True)
    yield c.start()
    c.stop()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def cli_env(cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    lab = SshLab(tmp_path_factory.mktemp("ssh") / "lab")
    lab.add_server("hpc-login", gpu=("NVIDIA A100 80GB PCIe", 2, 81920, "550.127.05", "12.4"), env=cluster.env())
    home = tmp_path_factory.mktemp("home")
    env = {**os.environ, **lab.env(), "GPUCLOUD_HOME": str(home), "CI": "true", "PYTHONPATH": str(REPO)}
    env.pop("SLURM_CONF", None)  # the CLI reaches Slurm only through the login node
    yield env
    lab.close()


def job_file(tmp_path: Path, name: str, resources: str, body: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nresources: {{cloud: slurm, cluster: hpc-login, {resources}}}\nmax_duration: 10m\n{body}"
    )
    return path


# Printed by the job: nproc in the batch step and in an srun of its own, and Slurm's record of the job.
SHOW = r"""run: |
  echo "job=$SLURM_JOB_ID outer nproc=$(nproc)"
  srun nproc | sed 's/^/inner nproc=/'
  scontrol show job -o "$SLURM_JOB_ID" | tr ' ' '\n' | grep -E '^(NumCPUs|MinMemoryNode|TRES)='
"""


def test_min_vcpus_and_memory_reach_the_job_and_its_srun(
    cluster: SlurmCluster, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """Before: sbatch asked for no CPUs or memory: NumCPUs=1, nproc 1 in the job and its srun."""
    spec = job_file(tmp_path, "sized", "gpu: A100-80GB:1, min_vcpus: 2, min_memory_gib: 1", SHOW)
    res = cli("run", str(spec), cwd=tmp_path, env=cli_env, timeout=240)
    out = flat(res.stdout + res.stderr)
    assert res.returncode == 0, out
    assert "outer nproc=2" in out and "inner nproc=2" in out, out
    assert "NumCPUs=2" in out and "MinMemoryNode=1G" in out and re.search(r"TRES=cpu=2,mem=1G,", out), out
    found = re.search(r"job=(\d+) ", out)
    assert found, out
    record = cluster.scontrol("show", "job", found.group(1)).stdout  # the controller's word, after the job
    assert "NumCPUs=2 " in record and "MinMemoryNode=1G " in record and "JobState=COMPLETED" in record, record


def test_an_autodetect_partition_plans_and_runs(cli_env: dict[str, str], tmp_path: Path) -> None:
    """Before: `no gpu:a100-80gb GRES (gpu:nvidia_a100_80gb_pcie)`, plan exit 2. Both GPUs of a node:
    both of its CPUs and all its memory, inside the batch script's srun on each of two nodes."""
    body = (
        'num_nodes: 2\nrun: echo "rank $NODE_RANK nproc=$(nproc) mem=$SLURM_MEM_PER_NODE gpus=$CUDA_VISIBLE_DEVICES"\n'
    )
    spec = job_file(tmp_path, "auto", "gpu: A100-80GB:2", body)
    plan = cli("plan", str(spec), "--json", cwd=tmp_path, env=cli_env, timeout=240)
    assert plan.returncode == 0, plan.stderr
    doc = json.loads(plan.stdout)
    assert [c["region"] for c in doc["candidates"]][:1] == ["hpc-login/gpu"], doc["candidates"]
    assert doc["candidates"][0]["instance_type"] == f"gpu:{AUTODETECTED}:2"
    assert "partition gpu: each node asks for 2 CPU(s) and 2 GiB memory (the node's share" in flat(
        " ".join(doc["warnings"])
    )
    res = cli("run", str(spec), cwd=tmp_path, env=cli_env, timeout=240)
    out = flat(res.stdout + res.stderr)
    assert res.returncode == 0, out
    assert "rank 0 nproc=2 mem=2048 gpus=0,1" in out and "rank 1 nproc=2 mem=2048 gpus=0,1" in out, out
