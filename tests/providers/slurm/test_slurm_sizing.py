"""What a Slurm job asks for besides its GPUs, and what it reads back, without a cluster: the CPUs
and memory per node (the job's min_vcpus/min_memory_gib, else the node's share for its GPUs read
from sinfo) on sbatch and on the batch script's own srun, partitions whose nodes cannot hold them
left out with why, GRES types as `AutoDetect=nvml` names them matched like nvidia-smi's names,
and the job id read exactly from `sbatch --parsable` (`id` or `id;cluster`) by the real submit
script against a fake sbatch. The same against the real slurmctld: test_slurm_resources_e2e.py."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpucloud.contract.provider import CandidateError, FatalProvisionError, LaunchRequest, PlanRequest, RunHandle
from gpucloud.providers.slurm import batch
from gpucloud.providers.slurm.cluster import gpu_matches, gpu_model, parse_plan
from gpucloud.providers.slurm.provider import SlurmProvider, _judge
from gpucloud.providers.slurm.sizing import Size

# Real NVML device names (nvidia-smi's) as AutoDetect=nvml types them: lower case, spaces as `_`.
AUTODETECTED = [
    ("nvidia_h100_80gb_hbm3", "H100"),
    ("nvidia_h100_pcie", "H100"),
    ("nvidia_h100_nvl", "H100-NVL"),
    ("nvidia_h200", "H200"),
    ("nvidia_a100_80gb_pcie", "A100-80GB"),
    ("nvidia_a100-sxm4-80gb", "A100-80GB"),
    ("nvidia_a100-sxm4-40gb", "A100-40GB"),
    ("nvidia_a100-pcie-40gb", "A100-40GB"),
    ("nvidia_a10g", "A10G"),
    ("nvidia_a10", "A10"),
    ("nvidia_l4", "L4"),
    ("nvidia_l40s", "L40S"),
    ("tesla_k80", "K80"),
    ("tesla_k40m", "K40"),
    ("tesla_t4", "T4"),
    ("tesla_p100-pcie-16gb", "P100"),
    ("tesla_v100-sxm2-16gb", "V100"),
    ("tesla_v100-pcie-32gb", "V100-32GB"),  # the most specific model whose every token is there
    ("nvidia_gh200_480gb", None),  # GH200 is no H200: tokens match whole words only
    ("nvidia_geforce_rtx_4090", None),
]


@pytest.mark.parametrize(("gres_type", "model"), AUTODETECTED)
def test_autodetected_gres_types_are_the_gpus_nvidia_smi_names(gres_type: str, model: str | None) -> None:
    assert gpu_model(gres_type) == model


def test_a_family_name_accepts_each_of_its_models() -> None:
    assert gpu_matches("nvidia_a100_80gb_pcie", "A100") and gpu_matches("nvidia_a100_80gb_pcie", "A100-80GB")
    assert not gpu_matches("nvidia_a100_80gb_pcie", "A100-40GB") and not gpu_matches("mystery", "A100")


# Two partitions: `a100` with 8 GPUs, 64 CPUs and 512000 MB per node (n3 smaller), `cpu` with no GPU.
PLAN = """PartitionName=a100 AllowAccounts=ALL AllowQos=ALL Default=YES MaxTime=UNLIMITED State=UP
PartitionName=cpu AllowAccounts=ALL AllowQos=ALL Default=NO MaxTime=UNLIMITED State=UP
@nodes
n1|a100*|gpu:nvidia_a100-sxm4-80gb:8|gpu:nvidia_a100-sxm4-80gb:0(IDX:N/A)|idle|64|512000|
n2|a100*|gpu:nvidia_a100-sxm4-80gb:8|gpu:nvidia_a100-sxm4-80gb:2(IDX:0-1)|mixed|64|512000|
n3|a100*|gpu:nvidia_a100-sxm4-80gb:8|gpu:nvidia_a100-sxm4-80gb:0(IDX:N/A)|idle|32|256000|
c1|cpu|(null)|gpu:0|idle|16|64000|
"""


def ask(**kw: object) -> PlanRequest:
    base: dict[str, object] = {"gpu": "A100-80GB", "gpu_count": 2, "num_nodes": 1, "max_duration_s": 1800}
    base.update(kw)
    return PlanRequest(**base)  # type: ignore[arg-type]


def test_an_autodetect_partition_plans() -> None:
    """Before: `no gpu:a100-80gb GRES (gpu:nvidia_a100-sxm4-80gb)` and plan exited 2."""
    a100, _ = parse_plan(PLAN)
    why, gres_type, idle, _ = _judge(a100, ask())
    assert (why, gres_type, idle) == ("", "nvidia_a100-sxm4-80gb", 22)


def test_gpu_jobs_default_to_the_nodes_share_for_their_gpus() -> None:
    """2 of 8 GPUs: a quarter of the smallest fitting node's CPUs and memory; all 8: the whole of it."""
    a100, cpu = parse_plan(PLAN)
    assert a100.cpus["n3"] == 32 and a100.memory_mb["n1"] == 512000
    assert _judge(a100, ask())[3] == Size(cpus=8, memory_mb=64000, derived=True)
    assert _judge(a100, ask(gpu_count=8))[3] == Size(cpus=32, memory_mb=256000, derived=True)
    assert _judge(a100, ask(gpu_count=1, num_nodes=2))[3] == Size(cpus=4, memory_mb=32000, derived=True)
    # What the job sets is asked as set; the other one keeps its default.
    assert _judge(a100, ask(min_vcpus=2, min_memory_gib=1))[3] == Size(cpus=2, memory_mb=1024)
    assert _judge(a100, ask(min_vcpus=12))[3] == Size(cpus=12, memory_mb=64000, derived=True)
    # A CPU job keeps the site's defaults unless it sets them.
    assert _judge(cpu, ask(gpu=None, gpu_count=0))[3] == Size()
    assert _judge(cpu, ask(gpu=None, gpu_count=0, min_vcpus=4))[3] == Size(cpus=4)
    # Nodes whose sinfo gave no CPUs or memory (an older answer of 5 columns): the site's defaults.
    old = parse_plan(PLAN.replace("|64|512000|", "|").replace("|32|256000|", "|"))[0]
    assert _judge(old, ask())[3] == Size()


def test_a_partition_whose_nodes_cannot_hold_the_request_is_left_out_with_why() -> None:
    a100, cpu = parse_plan(PLAN)
    # Two nodes hold 48 CPUs (n3 has 32): a two-node job fits them, with their idle GPUs counted.
    assert _judge(a100, ask(min_vcpus=48, num_nodes=2))[:3] == ("", "nvidia_a100-sxm4-80gb", 14)
    assert _judge(a100, ask(min_vcpus=48, num_nodes=3))[0] == (
        "3 usable node(s) with 2 gpu:nvidia_a100-sxm4-80gb, 2 of them with 48 CPU(s) and 64000 MB memory, "
        "the job needs 3"
    )
    assert _judge(a100, ask(min_memory_gib=1000))[0] == (
        "3 usable node(s) with 2 gpu:nvidia_a100-sxm4-80gb, 0 of them with 8 CPU(s) and 1000 GiB memory, "
        "the job needs 1"
    )
    assert _judge(cpu, ask(gpu=None, gpu_count=0, min_vcpus=32))[0] == (
        "1 usable node(s), 0 of them with 32 CPU(s), the job needs 1"
    )


def launch(**kw: object) -> LaunchRequest:
    base: dict[str, object] = {
        "run_id": "r1",
        "job_name": "j",
        "region": "local/a100",
        "instance_type": "gpu:nvidia_a100-sxm4-80gb:2",
        "num_nodes": 2,
        "user_data": ["", ""],
        "expires_at": datetime(2030, 1, 1, tzinfo=UTC),
        "gpu": "A100-80GB",
        "gpu_count": 2,
        "max_duration_s": 600,
    }
    base.update(kw)
    return LaunchRequest(**base)  # type: ignore[arg-type]


def test_cpus_and_memory_go_to_sbatch_and_to_the_inner_srun() -> None:
    """Before: sbatch had no --cpus-per-task or --mem, and the batch script's srun none either."""
    opts = batch.sbatch_options(launch(vcpus=8, memory_gib=62.5), "a100", "nvidia_a100-sxm4-80gb", "c")
    assert {"--cpus-per-task=8", "--mem=64000M", "--ntasks-per-node=1"} <= set(opts)
    script = batch.batch_script("r1", "/home/u/.gpucloud/work/r1", Size.of(8, 62.5))
    assert "export SRUN_CPUS_PER_TASK=8\n" in script  # any srun of the job's own: not inherited since 22.05
    assert "exec srun --ntasks-per-node=1 --cpus-per-task=8 --mem=64000M --kill-on-bad-exit=0 bash" in script
    bare = batch.batch_script("r1", "/w")
    assert "SRUN_CPUS_PER_TASK" not in bare and "exec srun --ntasks-per-node=1 --kill-on-bad-exit=0 bash" in bare
    assert not any(o.startswith(("--cpus-per-task", "--mem")) for o in batch.sbatch_options(launch(), "a", "t", "c"))


FAKE_SBATCH = r"""#!/bin/bash
# sbatch: logs its arguments, prints $FAKE_OUT (printf %b) on stdout and a warning on stderr.
echo "$*" >>"$FAKE_SLURM/sbatch.log"
echo "sbatch: warning: a site's note on stderr" >&2
printf '%b' "$FAKE_OUT"
"""
FAKE_SQUEUE = r"""#!/bin/bash
# squeue: the caller's job named gpucloud-r1 is 77 (the job an unreadable sbatch did submit); no other.
echo "$*" >>"$FAKE_SLURM/squeue.log"
case " $* " in *" -n gpucloud-r1 "*) echo 77 ;; esac
"""
FAKE_SCANCEL = r"""#!/bin/bash
echo "$*" >>"$FAKE_SLURM/scancel.log"
"""


class Journal:
    def __init__(self) -> None:
        self.created_ids: list[str] = []

    def intent(self, run_id: str, kind: str, name: str, region: str, cloud: str) -> int:
        return 1

    def created(self, res_id: int, cloud_id: str) -> None:
        self.created_ids.append(cloud_id)

    def deleted(self, res_id: int) -> None:
        pass

    def resources(self, run_id: str, alive_only: bool = True) -> list:
        return []

    def event(self, run_id: str, kind: str, message: str) -> None:
        pass


@pytest.fixture
def fake_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("squeue", FAKE_SQUEUE), ("scancel", FAKE_SCANCEL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(tmp_path))
    monkeypatch.setenv("GPUCLOUD_REMOTE_ROOT", str(tmp_path / "remote"))
    return tmp_path


def submit(fake: Path, monkeypatch: pytest.MonkeyPatch, out: str) -> RunHandle:
    monkeypatch.setenv("FAKE_OUT", out)
    return SlurmProvider().provision(launch(num_nodes=1, user_data=["echo"], vcpus=2, memory_gib=1), Journal())


@pytest.mark.parametrize(("out", "job_id"), [("4242\n", "4242"), ("4242;gctest7\n", "4242"), ("9;c1", "9")])
def test_the_job_id_is_read_exactly(fake_sbatch: Path, monkeypatch: pytest.MonkeyPatch, out: str, job_id: str) -> None:
    """Before: `tr -cd 0-9` read `4242;gctest7` as job 42427 (the cluster name's digits glued on)."""
    handle = submit(fake_sbatch, monkeypatch, out)
    assert handle.resources["job"] == [job_id]
    assert (fake_sbatch / "remote" / "work" / "r1" / "slurm-job").read_text() == f"{job_id}\n"
    assert "--cpus-per-task=2 --mem=1024M" in (fake_sbatch / "sbatch.log").read_text()
    assert not (fake_sbatch / "scancel.log").exists()


@pytest.mark.parametrize("out", ["Submitted batch job 4242\n", "4242\n4243\n", "", "gctest7;4242\n"])
def test_anything_else_is_a_clear_error_and_the_job_is_cancelled(
    fake_sbatch: Path, monkeypatch: pytest.MonkeyPatch, out: str
) -> None:
    with pytest.raises(FatalProvisionError) as err:
        submit(fake_sbatch, monkeypatch, out)
    assert "not a job id (`jobid` or `jobid;cluster`)" in err.value.message
    assert "-u" in (fake_sbatch / "scancel.log").read_text() and " 77" in (fake_sbatch / "scancel.log").read_text()
    assert not (fake_sbatch / "remote" / "work" / "r1").exists(), "the run's folder is removed"


def test_a_refused_submission_is_the_candidates_error(fake_sbatch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (fake_sbatch / "bin" / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Invalid qos' >&2; exit 1\n")
    with pytest.raises(CandidateError) as err:
        submit(fake_sbatch, monkeypatch, "")
    assert "sbatch refused the job in partition a100: sbatch: error: Invalid qos" in err.value.message
