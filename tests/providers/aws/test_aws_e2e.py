"""End to end on AWS, against moto in server mode and the VM simulator.

- The examples (quickstart.yaml and t4-any-cloud.yaml, --cloud aws) run through the real CLI in a
  subprocess: logs stream, artifacts come back, nothing tagged with the run remains.
- Exit codes of DESIGN.md section 4: the job's own, 124 at max_duration, 130 on Ctrl-C, 75 when no
  candidate has capacity anywhere (every attempt listed).
- `run --detach`, then `down` in another process.
- The fault matrix: an error injected at each AWS call of provisioning and teardown x capacity /
  quota / throttling / generic failure (the last two, one path in the product, in turn over the
  calls: tests/support/fault_cells.py); Ctrl-C and SIGKILL in each phase. After each cell, the
  run's own teardown or `gpucloud gc` leaves zero tagged resources, and the failover order is the
  plan's. The summary test prints the matrix size and the leak count.

Subprocess CLIs run through tests/support/aws_cli.py (the real CLI plus botocore hooks); in-process
cells use typer's CliRunner with the same hooks.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

from tests.support.aws_faults import HOOKS, KINDS, Fault
from tests.support.aws_runs import (  # noqa: F401  (fixtures)
    EXAMPLES,
    RUN_ID,
    aws_env,
    drop_bucket,
    hooked_cli,
    inproc,
    invoke,
    plain_cli,
    run_id_in,
    settle,
    start_hooked_cli,
    write_aws_job,
)
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.fault_cells import SAME_PATH, cells, params
from tests.support.moto_server import Moto, moto, moto_server, tagged_alive  # noqa: F401
from tests.support.polling import wait_until
from tests.support.text import flat

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
MATRIX_RESULTS: dict[str, int] = {}  # cell -> tagged resources left at the end (must be 0)
ATTEMPT = re.compile(r"attempt \d+: (aws/[^ \n]+)")


def clean_up_and_count(moto: Moto, sim: AwsVmSimulator, cell: str = "") -> list[str]:  # noqa: F811
    """After a cell: if anything tagged is left, `gpucloud gc --yes` (in this process, with the
    hooks: the `inproc` fixture) must remove it. Returns what is still left afterwards (a leak) and
    records it in MATRIX_RESULTS."""
    HOOKS.faults.clear()
    settle(sim)
    if tagged_alive(moto):
        code, out = invoke("gc", "--yes")
        assert code == 0, out[-2000:]
        settle(sim)
    left = tagged_alive(moto)
    if cell:
        MATRIX_RESULTS[cell] = len(left)
    return left


# ---- the examples ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "example,itype,gpu_name,spot,model,epoch_line",
    [
        ("quickstart.yaml", "g4dn.xlarge", "Tesla T4", False, "model.json", "epoch    1 "),
        ("t4-any-cloud.yaml", "g4dn.xlarge", "Tesla T4", True, "model.pt", "epoch 1/"),
    ],
)
def test_example_runs_on_aws_with_logs_and_artifacts_and_leaves_nothing(
    aws_env: dict[str, str],
    moto: Moto,
    aws_sim: AwsVmSimulator,
    example: str,
    itype: str,  # noqa: F811
    gpu_name: str,
    spot: bool,
    model: str,
    epoch_line: str,
) -> None:
    if model.endswith(".pt"):
        pytest.importorskip("torch", reason="the example trains with PyTorch (CPU wheel in .ci/run)")
    proc = hooked_cli(aws_env, "run", str(EXAMPLES / example), "--cloud", "aws", "--json", timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["status"] == "succeeded" and doc["exit_code"] == 0
    art = Path(doc["artifacts_dir"])
    assert (art / "metrics.json").is_file() and (art / "outputs" / model).is_file()
    assert epoch_line in proc.stderr  # the streamed log (on stderr with --json)
    run_id = doc["run_id"]
    assert tagged_alive(moto, run_id) == [], "nothing of the run may remain"
    (iid,) = aws_sim.booted
    guest = aws_sim.guest(iid)
    assert guest is not None and guest.meta["instance_type"] == itype and guest.meta["gpu_name"] == gpu_name
    assert "nvidia-smi --query-gpu=name --format=csv,noheader" in guest.stub_calls()
    inst = moto.client("ec2").describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    assert inst["State"]["Name"] == "terminated"
    assert (inst.get("InstanceLifecycle") == "spot") is spot
    # The log is still there after teardown (S3 keeps it).
    logs = hooked_cli(aws_env, "logs", run_id)
    assert logs.returncode == 0 and "epoch" in logs.stdout
    # Whether the guest's own `shutdown` or the CLI's teardown ends the instance first is a race
    # here; the VM's self-termination is proven without a CLI in the detached test below.


def test_detached_vm_terminates_itself_when_the_job_ends(
    aws_env: dict[str, str],
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,
    tmp_path: Path,
) -> None:
    job = write_aws_job(tmp_path / "job.yaml", run="echo self-terminating")
    proc = hooked_cli(aws_env, "run", str(job), "--cloud", "aws", "--detach", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert wait_until(lambda: len(aws_sim.booted) == 1, timeout=30)
    (iid,) = aws_sim.booted
    assert wait_until(lambda: iid in aws_sim.shutdowns, timeout=60), "the VM ends itself (shutdown -h now)"
    ec2 = moto.client("ec2", aws_sim.region_of.get(iid, "us-east-1"))
    state = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state in {"shutting-down", "terminated"}
    run_id = json.loads(proc.stdout)["run_id"]
    assert hooked_cli(aws_env, "down", run_id, "--yes").returncode == 0  # the security group goes with `down`
    assert tagged_alive(moto, run_id) == []


# ---- exit codes -----------------------------------------------------------------------------------------


def test_job_failure_exit_code_is_the_jobs(aws_env: dict[str, str], moto: Moto, tmp_path: Path) -> None:  # noqa: F811
    """Also: temporary credentials that end before the deadline are warned about before launching."""
    from datetime import UTC, datetime, timedelta

    job = write_aws_job(tmp_path / "job.yaml", run="echo failing; exit 3", max_duration="2h")
    soon = (datetime.now(UTC) + timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    env = {**aws_env, "AWS_SESSION_TOKEN": "session-token", "AWS_CREDENTIAL_EXPIRATION": soon}
    proc = hooked_cli(env, "run", str(job), "--cloud", "aws")
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "failing" in proc.stdout
    warning = proc.stderr.index("warning: the AWS credentials (env) are temporary")
    assert warning < proc.stderr.index("provision done"), "warned before the launch"
    assert tagged_alive(moto, run_id_in(proc.stderr)) == []


def test_max_duration_exit_code_124(aws_env: dict[str, str], moto: Moto, tmp_path: Path) -> None:  # noqa: F811
    job = write_aws_job(tmp_path / "job.yaml", run="echo started; sleep 60", max_duration="4s")
    t0 = time.monotonic()
    proc = hooked_cli(aws_env, "run", str(job), "--cloud", "aws")
    assert proc.returncode == 124, proc.stderr[-2000:]
    assert time.monotonic() - t0 < 40
    assert tagged_alive(moto, run_id_in(proc.stderr)) == []


def test_no_capacity_anywhere_exits_75_listing_every_attempt(
    aws_env: dict[str, str],
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,
) -> None:
    from gpucloud.plan.planner import make_plan
    from gpucloud.spec.load import load_spec

    example = EXAMPLES / "t4-any-cloud.yaml"
    plan = make_plan(load_spec(example), cloud="aws")
    proc = hooked_cli(
        aws_env,
        "run",
        str(example),
        "--cloud",
        "aws",
        faults=[Fault("RunInstances", "InsufficientInstanceCapacity", times=None)],
    )
    assert proc.returncode == 75, proc.stderr[-3000:]
    assert "no candidate could be provisioned" in flat(proc.stderr)
    expected = [f"{c.cloud}/{c.region}/{c.instance_type}" for c in plan.candidates]
    assert ATTEMPT.findall(proc.stderr) == expected, "failover follows the plan's order"
    items = proc.stderr.replace("\n    ", " ")  # an item's wrapped lines joined to it
    listed = [line for line in items.splitlines() if line.startswith("  - aws/")]
    assert len(listed) == len(plan.candidates) and all("capacity" in line for line in listed)
    assert aws_sim.booted == []
    assert tagged_alive(moto) == []


def test_failover_follows_the_plan_skipping_a_region_out_of_quota(
    inproc: None,
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,
) -> None:
    """Quota in us-east-1 skips every us-east-1 candidate (named with its quota code); capacity in
    the next region the plan ranks moves to the candidate after it, in plan order."""
    from gpucloud.plan.planner import make_plan
    from gpucloud.spec.load import load_spec

    example = EXAMPLES / "t4-any-cloud.yaml"
    plan = [f"aws/{c.region}/{c.instance_type}" for c in make_plan(load_spec(example), cloud="aws").candidates]
    others = [c for c in plan if not c.startswith("aws/us-east-1/")]
    full = others[0].split("/")[1]  # the first region after us-east-1: out of capacity
    expected = [plan[0], others[0], next(c for c in others if c.split("/")[1] != full)]
    HOOKS.add(
        Fault("RunInstances", "MaxSpotInstanceCountExceeded", times=None, region="us-east-1"),
        Fault("RunInstances", "InsufficientInstanceCapacity", times=None, region=full),
    )
    code, out = invoke("run", str(example), "--cloud", "aws", "--detach")
    try:
        assert code == 0, out[-3000:]
        attempts = ATTEMPT.findall(out)
        assert attempts[:2] == expected[:2], (attempts, plan)
        assert attempts[-1] == expected[-1], (attempts, plan)
        assert all(c.split("/")[1] == full for c in attempts[1:-1]), attempts  # only the full region's types
        assert "L-3819A6DF" in out  # G/VT spot quota named
    finally:
        HOOKS.faults.clear()
        if RUN_ID.search(out):
            invoke("down", run_id_in(out), "--yes")
    assert clean_up_and_count(moto, aws_sim) == []


def test_a_region_without_the_image_fails_one_candidate_not_the_cloud(
    inproc: None,
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,
) -> None:
    """The cheapest region has no Ubuntu AMI (its SSM parameter names one that is gone): that
    candidate fails with its own reason (kind `image`) and failover goes on in the next region of
    the same cloud, instead of skipping the rest of AWS with a hint to ask for quota."""
    from moto.ec2.models import ec2_backends

    from gpucloud.plan.planner import make_plan
    from gpucloud.spec.load import load_spec
    from tests.support.moto_server import ACCOUNT, CANONICAL, seed_ubuntu_images

    example = EXAMPLES / "t4-any-cloud.yaml"
    plan = [f"aws/{c.region}/{c.instance_type}" for c in make_plan(load_spec(example), cloud="aws").candidates]
    bare = plan[0].split("/")[1]
    ec2 = ec2_backends[ACCOUNT][bare]
    for ami in [a for a in ec2.amis.values() if a.owner_id == CANONICAL]:
        ec2.deregister_image(ami.id)
    code, out = invoke("run", str(example), "--cloud", "aws", "--detach")
    try:
        assert code == 0, out[-3000:]
        attempts = ATTEMPT.findall(out)
        assert attempts[0] == plan[0] and attempts[-1].split("/")[1] != bare, attempts
        assert re.search(rf"failed: image: [^\n]* AMI in {bare}\.", flat(out)), out
        assert "the rest of aws" not in out and "quota" not in out
    finally:
        if RUN_ID.search(out):
            invoke("down", run_id_in(out), "--yes")
        seed_ubuntu_images(moto, [bare])
    assert clean_up_and_count(moto, aws_sim) == []


def test_detach_then_down_in_another_process(
    aws_env: dict[str, str],
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,
    tmp_path: Path,
) -> None:
    job = write_aws_job(tmp_path / "job.yaml", run="echo detached-output; sleep 60")
    proc = hooked_cli(aws_env, "run", str(job), "--cloud", "aws", "--detach", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_id = json.loads(proc.stdout)["run_id"]
    assert tagged_alive(moto, run_id), "the run keeps running after the CLI returned"
    assert wait_until(lambda: any("stage run" in g.console() for g in aws_sim.guests.values()), timeout=30)
    status = hooked_cli(aws_env, "status", run_id, "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["status"] == "running"
    # `down` through the real entry point against PLAIN moto: no test hooks, no placement-group fake
    # (a single-node run's teardown calls only the APIs for the kinds its handle lists).
    down = plain_cli(aws_env, "down", run_id, "--yes")
    assert down.returncode == 0, down.stderr[-2000:]
    assert tagged_alive(moto, run_id) == []
    assert wait_until(lambda: not aws_sim.leftover_processes(), timeout=10), "the guest ends with its instance"
    logs = hooked_cli(aws_env, "logs", run_id)
    assert "detached-output" in logs.stdout


def test_gc_dry_run_lists_then_gc_deletes_expired_leftovers_in_every_region(
    aws_env: dict[str, str], moto: Moto
) -> None:  # noqa: F811
    """What a crash before any state was written would leave: tagged, expired, unknown to the store."""
    from datetime import UTC, datetime, timedelta

    from gpucloud.contract.provider import expiry_tag as iso_utc

    tags = [
        {"Key": "gpucloud-run", "Value": "crashed-run"},
        {"Key": "gpucloud-expires", "Value": iso_utc(datetime.now(UTC) - timedelta(minutes=5))},
    ]
    made = []
    for region in ("eu-west-1", "ap-northeast-1"):
        ec2 = moto.client("ec2", region)
        vpc = ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
        made.append(
            ec2.create_security_group(
                GroupName="gpucloud-crashed-run-0",
                Description="x",
                VpcId=vpc,
                TagSpecifications=[{"ResourceType": "security-group", "Tags": tags}],
            )["GroupId"]
        )
    dry = hooked_cli(aws_env, "gc", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    for sg in made:
        assert f"would delete security group {sg}" in dry.stdout
    assert len(tagged_alive(moto, "crashed-run")) == 2
    real = hooked_cli(aws_env, "gc", "--yes")
    assert real.returncode == 0, real.stderr
    assert all(f"deleted security group {sg}" in real.stdout for sg in made)
    assert tagged_alive(moto, "crashed-run") == []


# ---- the fault matrix: every AWS call of provisioning and teardown x 4 kinds -----------------------------
# (throttle and generic take one path and alternate over the calls: tests/support/fault_cells.py)

# Provisioning calls, in the order a launch makes them: (service operation, job needs ssh).
# Faults hit us-east-1 only, every time: failover must move to us-west-2, the next candidate.
PROVISION_CALLS = [
    "GetCallerIdentity",
    "HeadBucket",
    "CreateBucket",
    "PutPublicAccessBlock",
    "PutBucketEncryption",
    "PutBucketLifecycleConfiguration",
    "PutObject",
    "GetParameter",
    "DescribeImages",
    "DescribeVpcs",
    "DescribeSubnets",
    "DescribeInstanceTypeOfferings",
    "CreateSecurityGroup",
    "AuthorizeSecurityGroupIngress",
    "CreateKeyPair",
    "RunInstances",
]
# Teardown calls: the fault lasts until the cell is cleaned up, so the run's own teardown fails
# (exit 70, with `gpucloud down RUN` named) and `gpucloud gc` must finish the job. A complete run
# handle lists its security group and key pair, so teardown deletes them without a Describe by tag
# (the tag lookups belong to partial handles: the Ctrl-C/SIGKILL cells below) and to gc.
TEARDOWN_CALLS = ["TerminateInstances", "DescribeInstances", "DeleteSecurityGroup", "DeleteKeyPair"]


@pytest.mark.parametrize(("call", "kind"), params(PROVISION_CALLS, KINDS))
def test_fault_matrix_provisioning(
    inproc: None,
    moto: Moto,
    aws_sim: AwsVmSimulator,  # noqa: F811
    tmp_path: Path,
    call: str,
    kind: str,
) -> None:
    if call == "CreateBucket":
        drop_bucket(moto, "us-east-1")
    job = write_aws_job(
        tmp_path / "job.yaml", run="echo fault-ok", regions="[us-east-1, us-west-2]", ssh=True, name="awsfault"
    )
    HOOKS.add(Fault(call, KINDS[kind], times=None, region="us-east-1"))
    code, out = invoke("run", str(job), "--cloud", "aws", "--detach")
    injected = [c for c in HOOKS.calls if c.injected == KINDS[kind]]
    reached = sorted({f"{c.operation}@{c.region}" for c in HOOKS.calls})
    assert injected, f"the fault at {call} was never reached (calls seen: {reached}):\n{out[-3000:]}"
    assert code == 0, out[-3000:]
    # failover: us-east-1 first (as planned), then us-west-2 where it worked
    assert ATTEMPT.findall(out) == ["aws/us-east-1/g4dn.xlarge", "aws/us-west-2/g4dn.xlarge"], out[-3000:]
    if kind == "quota" and call == "RunInstances":
        assert "L-DB2E81BA" in out
    run_id = run_id_in(out)
    assert tagged_alive(moto, run_id, regions=["us-east-1"]) == [], "the failed attempt cleaned up after itself"
    HOOKS.faults.clear()
    code, out = invoke("down", run_id, "--yes")
    assert code == 0, out[-2000:]
    left = clean_up_and_count(moto, aws_sim, cell=f"{call}/{kind}")
    assert left == [], left


@pytest.mark.parametrize(("call", "kind"), params(TEARDOWN_CALLS, KINDS))
def test_fault_matrix_teardown(
    inproc: None,
    moto: Moto,
    aws_sim: AwsVmSimulator,  # noqa: F811
    tmp_path: Path,
    call: str,
    kind: str,
) -> None:
    job = write_aws_job(tmp_path / "job.yaml", run="echo fault-ok", ssh=True, name="awstear")
    HOOKS.add(Fault(call, KINDS[kind], times=None))
    code, out = invoke("run", str(job), "--cloud", "aws")
    reached = sorted({f"{c.operation}@{c.region}" for c in HOOKS.calls})
    assert any(c.injected for c in HOOKS.ops(call)), f"{call} never reached (calls: {reached}):\n{out[-3000:]}"
    assert code == 70, out[-3000:]  # the job succeeded, the teardown did not: say so
    run_id = run_id_in(out)
    assert f"gpucloud down {run_id}" in out
    assert "fault-ok" in out
    left = clean_up_and_count(moto, aws_sim, cell=f"{call}/{kind}")
    assert left == [], left
    assert not aws_sim.leftover_processes()


# ---- Ctrl-C and SIGKILL in each phase ----------------------------------------------------------------------

# phase: (job command, a stall that holds the CLI in that phase (operation, after the answer?))
PHASES = {
    "security-group": ("echo hi", ("CreateSecurityGroup", True)),
    "launch": ("echo hi", ("RunInstances", True)),
    "running": ("sleep 3; echo done", None),
    "teardown": ("echo hi", ("TerminateInstances", True)),
}


@pytest.mark.parametrize("how", ["ctrl-c", "killed"])
@pytest.mark.parametrize("phase", list(PHASES))
def test_interrupted_or_killed_cli_leaves_nothing(
    aws_env: dict[str, str],
    inproc: None,
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,
    tmp_path: Path,
    phase: str,
    how: str,
) -> None:
    run, stall = PHASES[phase]
    job = write_aws_job(tmp_path / "job.yaml", run=run, ssh=True, name="awskill")
    record = tmp_path / "ops.txt"
    env = {**aws_env, "GPUCLOUD_TEST_AWS_RECORD": str(record)}
    faults = [Fault(stall[0], None, delay=2.0, after=stall[1], times=1)] if stall else []
    proc = start_hooked_cli(env, "run", str(job), "--cloud", "aws", faults=faults)

    def reached() -> bool:
        if stall is not None:
            return record.is_file() and f" {stall[0]} " in record.read_text()
        return any("stage run" in g.console() for g in list(aws_sim.guests.values()))

    try:
        assert wait_until(lambda: reached() or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, f"the CLI ended before the {phase} phase: {proc.communicate()[1][-2000:]}"
        time.sleep(0.3)  # inside the stalled call
        proc.send_signal(signal.SIGINT if how == "ctrl-c" else signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    if how == "ctrl-c":
        # Ctrl-C during the teardown is answered with "still tearing down" and changes nothing.
        assert proc.returncode == (0 if phase == "teardown" else 130), err[-2000:]
        assert "Traceback" not in err
        if phase != "teardown":
            run_id = run_id_in(err)
            assert tagged_alive(moto, run_id) == [], "the run's own teardown after Ctrl-C"
    else:
        assert proc.returncode == -signal.SIGKILL
    left = clean_up_and_count(moto, aws_sim, cell=f"{how}@{phase}")
    assert left == [], left
    assert not aws_sim.leftover_processes()


def test_fault_matrix_summary() -> None:
    """Prints the matrix size and the leak count (run with -s to see it)."""
    leaks = sum(MATRIX_RESULTS.values())
    matrix = len(cells(PROVISION_CALLS, KINDS)) + len(cells(TEARDOWN_CALLS, KINDS))
    print(
        f"\nAWS fault matrix: {len(MATRIX_RESULTS)} cells ({len(PROVISION_CALLS)} provisioning + "
        f"{len(TEARDOWN_CALLS)} teardown calls x {len(KINDS)} error kinds, {'/'.join(SAME_PATH)} in turn: "
        f"{matrix} cells; + {len(PHASES)} phases x Ctrl-C/SIGKILL), leaked resources: {leaks}"
    )
    assert leaks == 0
