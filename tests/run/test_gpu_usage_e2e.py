"""Right-sizing end to end on the AWS and Azure simulators (moto server / fake ARM + Azurite, and
the VM simulator): the stub nvidia-smi
reports scripted utilisation and memory, the node's sampler rides on status.json, the run's end
summary and `cost RUN --json` show peak memory, mean/p95 utilisation and GPU-idle time, and `cost`
names the cheaper machine that would have held the peak; an idle job with `idle_timeout` ends
within the threshold plus one sample and leaves nothing running."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support.aws_runs import aws_env, hooked_cli, run_id_in  # noqa: F401
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.azure_fixtures import arm, azure_env, azurite, fake_arm_server, leftovers  # noqa: F401
from tests.support.azure_sim import AzureVmSimulator, azure_sim  # noqa: F401
from tests.support.cli import cli
from tests.support.fake_arm import FakeArm
from tests.support.moto_server import Moto, moto, moto_server, tagged_alive  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _job(path: Path, run: str, gpu: str = "A10G:1", extra: str = "") -> Path:
    path.write_text(
        f"name: sized\nresources:\n  cloud: aws\n  regions: [us-east-1]\n  gpu: {gpu}\n{extra}"
        f"run: {run}\nmax_duration: 10m\n"
    )
    return path


def test_cost_names_the_cheaper_machine_that_held_the_peak(
    aws_env: dict[str, str],  # noqa: F811
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STUB_GPU_UTIL", "80,20,20,20")
    monkeypatch.setenv("STUB_GPU_MEM_USED", "6000,8000,7000")  # MiB: 7.8 GiB peak of the A10G's 24
    summary = tmp_path / "step-summary.md"
    env = {**aws_env, "GPUCLOUD_GPU_SAMPLE_S": "0.3", "GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
    job = _job(tmp_path / "job.yaml", "sleep 3")
    proc = hooked_cli(env, "run", str(job), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = run_id_in(proc.stderr)
    assert "GPU use: peak memory 7.81 of 24 GiB per GPU" in proc.stderr, proc.stderr[-2000:]
    cost = hooked_cli(env, "cost", run_id, "--json")
    assert cost.returncode == 0, cost.stderr
    usage = json.loads(cost.stdout)["runs"][0]["gpu_usage"]
    assert usage["peak_memory_gib"] == 7.81 and usage["gpu_memory_gib"] == 24.0
    assert 20 <= usage["util_mean"] < 80 and usage["util_p95"] == 80.0 and usage["samples"] >= 3
    fit = usage["right_size"]
    assert fit["instance_type"] == "g4dn.xlarge" and fit["gpu"] == "T4"  # 16 GiB holds 7.8 GiB + 25 %
    assert fit["would_have_cost"] < fit["cost"] and fit["saving"] > 0
    human = hooked_cli(env, "cost", run_id)
    assert "right-size: g4dn.xlarge" in " ".join(human.stdout.split()), human.stdout
    table = summary.read_text()  # the GitHub step summary embeds the GPU use as a small table
    assert "| peak memory per GPU | 7.81 of 24 GiB |" in table and "| would have fitted | `g4dn.xlarge`" in table
    status = hooked_cli(env, "status", run_id)
    assert "node 0: gpu0 20 % 6.8/24 GiB" in status.stdout and "right-size: g4dn.xlarge" in status.stdout, status.stdout
    assert tagged_alive(moto, run_id) == []


def test_idle_timeout_ends_a_hung_job(
    aws_env: dict[str, str],  # noqa: F811
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STUB_GPU_UTIL", "0")
    monkeypatch.setenv("STUB_GPU_MEM_USED", "300")
    env = {**aws_env, "GPUCLOUD_GPU_SAMPLE_S": "0.5"}
    job = _job(tmp_path / "job.yaml", "echo hung; sleep 300", gpu="T4:1", extra="  idle_timeout: 2\n")
    t0 = time.monotonic()
    proc = hooked_cli(env, "run", str(job), timeout=180)
    assert proc.returncode == 125, proc.stderr[-3000:]
    assert "idle_timeout" in proc.stderr and "stops billing" in " ".join(proc.stderr.split())
    assert time.monotonic() - t0 < 120  # far from the 300 s sleep or the 10 m max_duration
    run_id = run_id_in(proc.stderr)
    usage = json.loads(hooked_cli(env, "cost", run_id, "--json").stdout)["runs"][0]["gpu_usage"]
    # ended within the threshold + one sample (+ the watchdog's tick)
    assert 2.0 <= usage["gpu_idle_seconds"] <= 2.0 + 0.5 + 1.0, usage
    assert tagged_alive(moto, run_id) == []


def test_azure_run_reports_gpu_use_and_right_sizes(
    azure_env: dict[str, str],  # noqa: F811
    arm: FakeArm,  # noqa: F811
    azure_sim: AzureVmSimulator,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STUB_GPU_UTIL", "60,30")
    monkeypatch.setenv("STUB_GPU_MEM_USED", "9000,10000")  # 9.8 GiB of an A100-80GB's 80
    env = {**azure_env, "GPUCLOUD_GPU_SAMPLE_S": "0.3"}
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: sized\nresources:\n  cloud: azure\n  regions: [eastus]\n  gpu: A100-80GB:1\n"
        "run: sleep 3\nmax_duration: 10m\n"
    )
    proc = cli("run", str(job), timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = run_id_in(proc.stderr)
    assert "GPU use: peak memory 9.77 of 80 GiB per GPU" in " ".join(proc.stderr.split()), proc.stderr[-2000:]
    usage = json.loads(cli("cost", run_id, "--json", env=env).stdout)["runs"][0]["gpu_usage"]
    fit = usage["right_size"]
    assert fit["instance_type"] == "Standard_NC4as_T4_v3" and fit["region"] == "eastus", fit
    assert fit["saving"] > 0 and usage["util_p95"] == 60.0
    assert leftovers(arm) == []
