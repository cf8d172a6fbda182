"""A kept machine on the AWS simulator (moto + the VM simulator), through the real CLI: the second
job (`run --on`) shows its first line sooner than the cold run on the same machine (bench/bench_keep.py
holds it to 5 s); the machine then ends by its idle time and the run's follower leaves
nothing (no `down`, no `gc`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucloud.run import keep
from tests.support.aws_runs import AWS_CLI, aws_env, hooked_cli, run_id_in, settle  # noqa: F401  (fixtures)
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.keep_timing import record, timed_first_line
from tests.support.moto_server import Moto, moto, moto_server, tagged_alive  # noqa: F401
from tests.support.polling import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _job(path: Path, run: str) -> Path:
    path.write_text(
        "name: keptaws\nresources:\n  cloud: aws\n  regions: [us-east-1]\n  gpu: T4:1\n  ssh: true\n"
        f"keep: 30s\nmax_duration: 10m\nrun: {run}\n"
    )
    return path


def _roles(moto: Moto, run_id: str) -> list[str]:  # noqa: F811
    """The run's node roles (IAM: tagged like its other resources)."""
    iam = moto.client("iam")
    roles = iam.list_roles(PathPrefix="/gpucloud/")["Roles"]
    return [
        r["RoleName"]
        for r in roles
        if {t["Key"]: t["Value"] for t in iam.list_role_tags(RoleName=r["RoleName"])["Tags"]}.get("gpucloud-run")
        == run_id
    ]


def _job_run(path: Path, run: str) -> None:
    text = path.read_text()
    path.write_text(text[: text.index("run: ")] + f"run: '{run}'\n")


def test_a_kept_machine_takes_a_second_job_in_seconds_and_leaves_nothing(
    aws_env: dict[str, str],  # noqa: F811
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    tmp_path: Path,
) -> None:
    aws_env = {**aws_env, "GPUCLOUD_SSH_CIDR": "203.0.113.7/32"}  # `ssh: true`: the caller's address
    job = _job(tmp_path / "job.yaml", "echo first-line-cold")
    cold_s, proc = timed_first_line(
        ["run", str(job)], env=aws_env, cwd=tmp_path, marker="first-line-cold", module=AWS_CLI
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = run_id_in(proc.stderr)
    assert "the machine is kept for" in proc.stderr
    assert tagged_alive(moto, run_id), "a kept run's machine stays"
    keys = Path(aws_env["GPUCLOUD_HOME"]) / "keys"
    assert list(keys.glob(f"*{run_id}*")) and _roles(moto, run_id), "its session key and node role"
    job = _job(tmp_path / "job.yaml", "echo first-line-kept; exit 4")
    kept_s, proc = timed_first_line(
        ["run", "--on", run_id, str(job)], env=aws_env, cwd=tmp_path, marker="first-line-kept", module=AWS_CLI
    )
    assert proc.returncode == 4, proc.stderr[-3000:]
    record("aws-simulator", cold_s, kept_s)
    # The 5 s budget is bench/bench_keep.py's to hold (a timed assert fails on a loaded CI machine,
    # where this path measured 4.4-4.8 s); here the kept machine must beat the cold run outright.
    assert kept_s < cold_s, (kept_s, cold_s, proc.stderr[-2000:])
    # A job with its own secret and an S3 input: sealed to the node's key, copied before its run.
    moto.client("s3").create_bucket(Bucket="keep-in")
    moto.client("s3").put_object(Bucket="keep-in", Key="p/x.txt", Body=b"input-from-s3\n")
    job.write_text(job.read_text().replace("run: ", "secrets: [TOKEN_B]\ninputs: {d/: s3://keep-in/p}\nrun: ", 1))
    _job_run(job, 'echo "b-len=${#TOKEN_B} b=$TOKEN_B"; cat d/x.txt')
    proc = hooked_cli(aws_env, "run", "--on", run_id, str(job), "--secret", "TOKEN_B=sealed-for-job-2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "b-len=16 b=***" in proc.stdout and "input-from-s3" in proc.stdout, proc.stdout[-2000:]
    assert "sealed-for-job-2" not in proc.stdout + proc.stderr
    # Idle for 30 s: the guest shuts itself down (the simulator ends the instance).
    (iid,) = aws_sim.booted
    assert wait_until(
        lambda: (
            moto.client("ec2").describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]["Name"]
            == "terminated"
        ),
        timeout=60,
    )
    settle(aws_sim)
    assert aws_sim.leftover_processes() == []
    # Nobody runs `down` or `gc`: the run's follower deletes the security group and the rest.
    left = lambda: tagged_alive(moto, run_id) + _roles(moto, run_id) + [str(k) for k in keys.glob(f"*{run_id}*")]  # noqa: E731
    assert wait_until(lambda: left() == [], timeout=60), left()  # the node role and the key here too
    assert wait_until(lambda: keep.follower_pid(run_id) is None, timeout=20)  # its records written, it is gone
    doc = json.loads(hooked_cli(aws_env, "status", run_id, "--json").stdout)
    assert doc["status"] == "succeeded" and all(r["status"] == "deleted" for r in doc["resources"]), doc
    assert any("torn down" in e["message"] and "nothing left" in e["message"] for e in doc["events"])
