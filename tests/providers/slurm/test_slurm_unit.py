"""The slurm provider's parsing and decisions without a cluster: GRES strings, time limits, the
plan's partition verdicts, sbatch options, and how Slurm's job state changes a node's status."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpucloud.contract.provider import LaunchRequest, PlanRequest
from gpucloud.providers.slurm import batch
from gpucloud.providers.slurm.channel import merge
from gpucloud.providers.slurm.cluster import JobState, gpu_model, gres_gpus, minutes, parse_job, parse_plan
from gpucloud.providers.slurm.provider import _judge

PLAN_OUTPUT = """PartitionName=k80 AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL Default=YES MaxTime=01:00:00 State=UP
PartitionName=a100 AllowAccounts=physics,chem AllowQos=ALL Default=NO MaxTime=2-00:00:00 State=UP
PartitionName=old AllowAccounts=ALL Default=NO MaxTime=UNLIMITED State=DOWN
@nodes
n1|k80*|gpu:k80:2(S:0-1)|gpu:k80:1(IDX:0)|mixed|
n2|k80*|gpu:k80:2|gpu:k80:0(IDX:N/A)|idle|
n3|a100|gpu:a100_80gb:4,gpu:t4:1|gpu:a100_80gb:4(IDX:0-3)|allocated|
n4|a100|gpu:a100_80gb:4|gpu:a100_80gb:0(IDX:N/A)|drained|
n5|old|gpu:2|gpu:0|idle|
"""


def test_gres_and_time_parsing() -> None:
    assert gres_gpus("gpu:k80:2(S:0-1),gpu:a100:4,shard:8") == {"k80": 2, "a100": 4}
    assert gres_gpus("gpu:2") == {"": 2} and gres_gpus("(null)") == {}
    assert [gpu_model(t) for t in ("k80", "tesla_k80", "a100_80gb", "v100", "mystery")] == [
        "K80",
        "K80",
        "A100-80GB",
        "V100",
        None,
    ]
    assert [minutes(t) for t in ("UNLIMITED", "60", "1:00:00", "2-00:00:00", "0:30", "1:00:01")] == [
        None,
        60,
        60,
        2880,
        1,
        61,
    ]


def plan_request(**kw: object) -> PlanRequest:
    base: dict[str, object] = {"gpu": "K80", "gpu_count": 2, "num_nodes": 1, "max_duration_s": 1800}
    base.update(kw)
    return PlanRequest(**base)  # type: ignore[arg-type]


def test_partition_verdicts() -> None:
    k80, a100, old = parse_plan(PLAN_OUTPUT)
    assert k80.default and k80.max_minutes == 60 and k80.usable_nodes == {"n1", "n2"}
    assert _judge(k80, plan_request())[:3] == ("", "k80", 3)  # three of four K80s idle
    assert _judge(k80, plan_request(max_duration_s=2 * 3600))[0] == (
        "its time limit (60 min) is below max_duration (120 min)"
    )
    assert _judge(k80, plan_request(num_nodes=3))[0] == "2 usable node(s) with 2 gpu:k80, the job needs 3"
    assert _judge(a100, plan_request())[0] == "no gpu:k80 GRES (gpu:a100_80gb, gpu:t4)"
    assert _judge(a100, plan_request(gpu="A100-80GB", gpu_count=4, scheduler={"account": "bio"}))[0] == (
        "not allowed for account bio"
    )
    ok = _judge(a100, plan_request(gpu="A100-80GB", gpu_count=4, scheduler={"account": "chem"}))
    assert ok[:3] == ("", "a100_80gb", 0)  # n4 is drained, n3 busy: it fits, and will queue
    assert _judge(old, plan_request())[0] == "it is DOWN"


def test_sbatch_options() -> None:
    req = LaunchRequest(
        run_id="r1",
        job_name="j",
        region="hpc/k80",
        instance_type="gpu:k80:2",
        num_nodes=2,
        user_data=["", ""],
        expires_at=datetime(2030, 1, 1, tzinfo=UTC),
        gpu="K80",
        gpu_count=2,
        scheduler={"account": "physics", "qos": "high", "constraint": "ib&k80"},
        max_duration_s=5430,
    )
    opts = batch.sbatch_options(req, "k80", "k80", "gpucloud-run=r1")
    for want in ("--nodes=2", "--ntasks-per-node=1", "--gres=gpu:k80:2", "--time=90", "--requeue"):
        assert want in opts
    assert {"--partition=k80", "--account=physics", "--qos=high", "--constraint=ib&k80"} <= set(opts)
    assert batch.time_limit(30) == "1" and batch.time_limit(3600) == "60"


JOB = """@base /r/channel/runs/r1/node-0 7
@job 42
JobId=42 JobName=gpucloud-r1 JobState={state} Reason={reason} Restarts={restarts} ExitCode={code} Partition=k80
@queue
41
42
"""


def job_state(state: str = "PENDING", reason: str = "Resources", restarts: int = 0, code: str = "0:0") -> JobState:
    parsed = parse_job(JOB.format(state=state, reason=reason, restarts=restarts, code=code))
    assert parsed is not None
    return parsed


def test_job_parsing() -> None:
    job = job_state()
    assert (job.job_id, job.position, job.log_base, job.waiting) == ("42", 2, {0: 7}, True)
    assert job.pending_message() == "queued in Slurm as job 42: PENDING (Resources), 2nd in partition k80's queue"
    assert job_state("TIMEOUT", code="0:15").exit_code == 143
    assert parse_job("@nojob") is None


SIGNALLED = {"state": "failed", "exit_code": None, "message": "bootstrap stopped by a signal", "stage": "done"}


@pytest.mark.parametrize(
    ("node", "slurm", "want_state", "want_code"),
    [
        (None, ("PENDING", "Resources", 0), "booting", None),
        (SIGNALLED, ("PENDING", "BeginTime", 1), "booting", None),  # requeued: not the end
        (SIGNALLED, ("RUNNING", "None", 0), "running", None),  # Slurm's reason comes with the job's end
        (SIGNALLED, ("TIMEOUT", "TimeLimit", 0), "deadline", None),
        (SIGNALLED, ("PREEMPTED", "None", 0), "preempted", None),
        (None, ("NODE_FAIL", "None", 0), "error", 70),
        (None, ("OUT_OF_MEMORY", "None", 0), "failed", 137),
        ({"state": "failed", "exit_code": 3, "message": "job exited with code 3"}, ("RUNNING", "None", 0), "failed", 3),
        ({"state": "succeeded", "exit_code": 0, "message": ""}, ("COMPLETED", "None", 0), "succeeded", 0),
        (None, ("FAILED", "NonZeroExitCode", 0), "failed", 1),
    ],
)
def test_slurm_state_applied_to_a_node_status(
    node: dict | None, slurm: tuple[str, str, int], want_state: str, want_code: int | None
) -> None:
    out = merge(dict(node) if node else None, job_state(*slurm), "r1", 0)
    assert out is not None
    assert (out["state"], out["exit_code"]) == (want_state, want_code)


def test_a_completed_job_is_no_success_without_the_nodes_word() -> None:
    assert merge(None, job_state("COMPLETED", "None"), "r1", 0) is None


def test_artifacts_stream_from_the_login_into_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The channel's get_to_file streams through Login.run(sink=) (here `cluster: local`): the
    artifacts tarball lands in the file, and a missing object is False."""
    from gpucloud.providers.slurm.channel import SlurmChannel
    from gpucloud.providers.slurm.login import Login

    monkeypatch.setenv("GPUCLOUD_REMOTE_ROOT", str(tmp_path / "remote"))
    chan = SlurmChannel(Login("local"))
    data = bytes(range(256)) * 4096
    chan.put_bytes("runs/r1/node-0/artifacts.tar.gz", data)
    dest = tmp_path / "a.tgz"
    assert chan.get_to_file("runs/r1/node-0/artifacts.tar.gz", dest) and dest.read_bytes() == data
    assert not chan.get_to_file("runs/r1/node-1/artifacts.tar.gz", tmp_path / "b.tgz")
