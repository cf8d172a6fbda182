"""The node's own AWS identity on moto and the VM simulator (docs/PROVIDERS.md, "AWS node identity").

- A run gets one IAM role + instance profile, tagged like the rest, whose inline policy admits only
  the run's objects; teardown and gc remove it (gc only with well-formed tags).
- The guest's agent signs its S3 requests with the role's credentials from the simulator's IMDSv2,
  through a strict SigV4 front (tests/support/s3_sigv4.py) that refuses expired presigned URLs and
  expired credentials: a run that lasts past the launching CLI's credentials (the front's clock
  jumps 11 minutes, they expired at 10) streams its log to the end and delivers status and artifacts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.moto_server import ACCOUNT, Moto, moto, moto_server  # noqa: F401
from tests.support.node_roles import node_roles, role_policies
from tests.support.polling import wait_until
from tests.support.s3_sigv4 import StrictS3

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture
def env(moto: Moto, aws_sim: AwsVmSimulator, gpucloud_home: Path, tmp_path: Path) -> dict[str, str]:  # noqa: F811
    out = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUCLOUD_TEST_", "AZURE_"))}
    out.update(moto.env)
    out.update({"GPUCLOUD_HOME": str(gpucloud_home), "CI": "true", "PYTHONPATH": str(REPO)})
    out["GPUCLOUD_SSH_CIDR"] = "203.0.113.7/32"
    return out


@pytest.fixture
def strict(moto: Moto, aws_sim: AwsVmSimulator) -> Iterator[StrictS3]:  # noqa: F811
    """Every guest request to moto's S3 goes through the strict front (curl's http_proxy)."""
    front = StrictS3(moto.endpoint).start()
    front.register("testing", "testing", "", time.time() + 600)  # the CLI's: 10 minutes left
    aws_sim.on_credentials.append(front.register)
    aws_sim.extra_env.update({"http_proxy": front.base, "HTTP_PROXY": front.base})
    try:
        yield front
    finally:
        aws_sim.extra_env.clear()
        aws_sim.on_credentials.clear()
        front.stop()


def job(path: Path, run: str, max_duration: str = "30m") -> Path:
    path.write_text(
        "name: ident\nresources:\n  cloud: aws\n  regions: [us-east-1]\n  gpu: T4:1\n"
        f"run: {json.dumps(run)}\nartifacts: [out]\nmax_duration: {max_duration}\n"
    )
    return path


def test_run_past_the_cli_credentials_delivers_log_status_and_artifacts(
    env: dict[str, str],
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    strict: StrictS3,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    gate = tmp_path / "gate"
    script = (
        f"echo first-line; while [ ! -e {gate} ]; do sleep 0.5; done; "
        "mkdir -p out; echo done > out/result.txt; echo last-line"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.aws_cli", "run", str(job(tmp_path / "job.yaml", script)), "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def log_landed() -> bool:  # the job runs: its first log part went through the front
            return any(
                ("/log/0" in path or who == "post") and code < 300 for _, path, code, who in list(strict.answers)
            )

        if not wait_until(lambda: log_landed() or proc.poll() is not None, timeout=120) or proc.poll() is not None:
            proc.kill()
            _, err = proc.communicate(timeout=30)
            raise AssertionError(f"{strict.answers[-20:]} {aws_sim.errors[-5:]} {aws_sim.booted}\n{err[-3000:]}")
        strict.advance(11 * 60)  # the CLI's credentials (and every URL they signed) are expired now
        gate.write_text("go")
        out, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 0, f"{strict.after_jump[-10:]}\n{err[-3000:]}"
    doc = json.loads(out)
    assert doc["status"] == "succeeded", doc
    assert "last-line" in err  # the log streamed to its end
    assert (Path(doc["artifacts_dir"]) / "out" / "result.txt").read_text() == "done\n"
    assert any(code == 200 and who == "node" for _, _, code, who in strict.after_jump)
    assert not [a for a in strict.after_jump if a[3] == "presigned" and a[2] == 200], "no CLI signature works now"
    assert node_roles(moto) == [], "the run's role goes with its teardown"


def test_an_output_written_after_the_cli_credentials_expired_lands(
    env: dict[str, str],
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    strict: StrictS3,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`outputs:` on S3 go signed by the node's role (its data policy) once the CLI's grants are dead;
    the front enforces the role's policies, so without the data policy the upload is refused."""
    monkeypatch.chdir(tmp_path)
    moto.client("s3").create_bucket(Bucket="gc-node-out")
    strict.authorize = role_policies(moto)
    gate = tmp_path / "gate"
    script = f"echo first-line; while [ ! -e {gate} ]; do sleep 0.5; done; mkdir -p res; echo late > res/model.txt"
    path = job(tmp_path / "job.yaml", script)
    path.write_text(path.read_text() + "outputs:\n  res: s3://gc-node-out/results\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.aws_cli", "run", str(path), "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        landed = lambda: any(("/log/0" in p or w == "post") and c < 300 for _, p, c, w in list(strict.answers))  # noqa: E731
        if not wait_until(lambda: landed() or proc.poll() is not None, timeout=120) or proc.poll() is not None:
            proc.kill()
            _, err = proc.communicate(timeout=30)
            raise AssertionError(f"{strict.answers[-20:]} {aws_sim.errors[-5:]}\n{err[-3000:]}")
        strict.advance(11 * 60)  # the CLI's credentials (and the output's presigned POST) are expired now
        gate.write_text("go")
        out, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    objs = moto.client("s3").list_objects_v2(Bucket="gc-node-out", Prefix="results/").get("Contents", [])
    assert [o["Key"] for o in objs] == ["results/model.txt"], f"{strict.after_jump[-10:]}\n{err[-3000:]}"
    assert any(p.endswith("/results/model.txt") and c == 200 and w == "node" for _, p, c, w in strict.after_jump)
    assert proc.returncode == 0 and json.loads(out)["status"] == "succeeded", err[-3000:]
    assert node_roles(moto) == [], "the role and its data policy go with the teardown"


# ---- the role itself (in process, moto) -----------------------------------------------------------


def _decide(policy: dict[str, object], action: str, resource: str, prefix: str = "") -> str:
    from tests.support.iam_eval import Request, decide

    return decide(policy, Request(action, resource, {"s3:prefix": prefix} if prefix else {}))


def test_node_role_admits_only_its_run_and_goes_with_teardown(moto, provider, journal, hooks) -> None:  # noqa: F811
    from gpucloud.contract.provider import TAG_EXPIRES, TAG_RUN
    from gpucloud.providers.aws.identity import POLICY_NAME, ROLE
    from tests.support.aws_requests import make_request

    req = make_request()
    handle = provider.provision(req, journal)
    iam = moto.client("iam")
    try:
        [name] = handle.resources[ROLE]
        role = iam.get_role(RoleName=name)["Role"]
        tags = {t["Key"]: t["Value"] for t in iam.list_role_tags(RoleName=name)["Tags"]}
        assert role["Path"] == "/gpucloud/us-east-1/" and len(name) <= 64
        assert tags[TAG_RUN] == req.run_id and tags[TAG_EXPIRES] == req.tags[TAG_EXPIRES]
        [call] = hooks.ops("RunInstances")
        assert call.params["IamInstanceProfile"] == {"Name": name}
        profile = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
        assert [r["RoleName"] for r in profile["Roles"]] == [name]
        policy = iam.get_role_policy(RoleName=name, PolicyName=POLICY_NAME)["PolicyDocument"]
        policy = json.loads(policy) if isinstance(policy, str) else policy
        bucket = f"arn:aws:s3:::gpucloud-{ACCOUNT}-us-east-1"
        run = f"{bucket}/runs/{req.run_id}"
        other = f"{bucket}/runs/other-20260101-000000-abcd"
        assert _decide(policy, "s3:GetObject", f"{run}/node-0/manifest") == "Allow"
        assert _decide(policy, "s3:PutObject", f"{run}/node-0/status.json") == "Allow"
        assert _decide(policy, "s3:PutObject", f"{run}/node-1/log/000003") == "Allow"
        assert _decide(policy, "s3:PutObject", f"{run}/checkpoint/slot-0.tar.gz") == "Allow"
        assert _decide(policy, "s3:GetObject", f"{other}/node-0/manifest") != "Allow", "another run's prefix"
        assert _decide(policy, "s3:PutObject", f"{other}/node-0/status.json") != "Allow"
        assert _decide(policy, "s3:PutObject", f"{run}/inputs/0/data.csv") != "Allow", "an input prefix"
        assert _decide(policy, "s3:PutObject", f"{run}/node-0/manifest") != "Allow", "its own manifest"
        assert _decide(policy, "s3:PutObject", f"{run}/code.tar.gz") != "Allow"
        assert _decide(policy, "s3:DeleteObject", f"{run}/node-0/status.json") != "Allow"
        assert _decide(policy, "s3:GetObject", "arn:aws:s3:::someone-else/x") != "Allow"
        claims = f"runs/{req.run_id}/node-0/log/claim-"
        assert _decide(policy, "s3:ListBucket", bucket, claims) == "Allow"
        assert _decide(policy, "s3:ListBucket", bucket, "runs/") != "Allow"
        kinds = sorted(r.kind for r in journal.resources(req.run_id))
        assert ROLE in kinds
    finally:
        provider.teardown(handle, journal)
    assert node_roles(moto) == [] and iam.list_instance_profiles(PathPrefix="/gpucloud/")["InstanceProfiles"] == []
    assert journal.resources(req.run_id) == []


def test_a_new_profile_refused_by_run_instances_is_retried(moto, provider, journal, hooks) -> None:  # noqa: F811
    from tests.support.aws_faults import Fault
    from tests.support.aws_requests import make_request

    message = (
        "Value (gpucloud-node-x) for parameter iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name"
    )
    hooks.add(Fault("RunInstances", "InvalidParameterValue", times=2, message=message))
    req = make_request()
    handle = provider.provision(req, journal)
    try:
        assert len(hooks.ops("RunInstances")) == 3 and len(handle.nodes) == 1
    finally:
        provider.teardown(handle, journal)
    assert node_roles(moto) == []


def test_gc_removes_expired_node_roles_and_names_malformed_ones(moto, provider, hooks) -> None:  # noqa: F811
    from datetime import UTC, datetime, timedelta

    from gpucloud.contract.provider import TAG_EXPIRES, TAG_RUN, expiry_tag
    from gpucloud.providers.aws.identity import EC2_TRUST, role_name, role_path

    iam = moto.client("iam")
    past = expiry_tag(datetime.now(UTC) - timedelta(hours=1))
    future = expiry_tag(datetime.now(UTC) + timedelta(hours=1))
    made = {}
    for label, tags in {
        "expired": {TAG_RUN: "old-20260101-000000-abcd", TAG_EXPIRES: past},
        "live": {TAG_RUN: "new-20260101-000000-abcd", TAG_EXPIRES: future},
        "hostile": {TAG_RUN: "../x", TAG_EXPIRES: past},
    }.items():
        name = made[label] = role_name(label, "us-east-1", 0)
        tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
        path = role_path("us-east-1")
        iam.create_role(RoleName=name, Path=path, AssumeRolePolicyDocument=json.dumps(EC2_TRUST), Tags=tag_list)
        iam.create_instance_profile(InstanceProfileName=name, Path=path, Tags=tag_list)
        iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
    try:
        lines = provider.gc(datetime.now(UTC), dry_run=False)
        left = node_roles(moto)
        assert made["expired"] not in left and made["live"] in left and made["hostile"] in left
        assert any("deleted node role " + made["expired"] in line for line in lines), lines
        assert any(made["hostile"] in line and "left alone" in line for line in lines), lines
        profiles = [p["InstanceProfileName"] for p in iam.list_instance_profiles()["InstanceProfiles"]]
        assert made["expired"] not in profiles
    finally:
        from gpucloud.providers.aws.identity import delete_identity

        for name in node_roles(moto):
            delete_identity(provider, name)


def test_node_role_gets_the_jobs_data_prefixes_only_and_loses_them_with_teardown(
    moto,  # noqa: F811
    provider,
    journal,
    hooks,
) -> None:
    """The grants' prefixes on the role itself (run/data_grants.py through the S3 store): the node's
    own signature reaches its inputs and outputs after the caller's credentials end, and nothing
    else of those buckets."""
    from gpucloud.providers.aws.identity import DATA_POLICY_NAME, ROLE
    from gpucloud.run.data_grants import DataPlan, Input, Output
    from gpucloud.spec.data import parse_location
    from tests.support.aws_requests import make_request

    req = make_request()
    handle = provider.provision(req, journal)
    iam = moto.client("iam")
    plan = DataPlan(
        inputs=[
            Input("train/", parse_location("s3://in-bucket/data/train"), [], "us-east-1"),
            Input("shards/", parse_location("s3://in-bucket/shards/"), [], "us-east-1", "mount"),
        ],
        outputs=[Output("out", parse_location("s3://out-bucket/results"), "us-east-1")],
    )
    try:
        [name] = handle.resources[ROLE]
        plan.admit(handle)
        raw = iam.get_role_policy(RoleName=name, PolicyName=DATA_POLICY_NAME)["PolicyDocument"]
        policy = json.loads(raw) if isinstance(raw, str) else raw
        ins, outs = "arn:aws:s3:::in-bucket", "arn:aws:s3:::out-bucket"
        assert _decide(policy, "s3:GetObject", f"{ins}/data/train/part-0") == "Allow"
        assert _decide(policy, "s3:GetObject", f"{ins}/data/train") == "Allow", "one object named exactly"
        assert _decide(policy, "s3:GetObject", f"{ins}/shards/a/b.bin") == "Allow"
        assert _decide(policy, "s3:ListBucket", ins, "shards/a/") == "Allow", "a mount lists its folder"
        assert _decide(policy, "s3:PutObject", f"{outs}/results/node-1/model.pt") == "Allow"
        assert _decide(policy, "s3:GetObject", f"{ins}/data/train-other/x") != "Allow", "a sibling prefix"
        assert _decide(policy, "s3:GetObject", f"{ins}/private/key.pem") != "Allow", "another prefix"
        assert _decide(policy, "s3:ListBucket", ins, "private/") != "Allow"
        assert _decide(policy, "s3:ListBucket", ins, "data/") != "Allow", "a copied input is not listed"
        assert _decide(policy, "s3:PutObject", f"{ins}/data/train/x") != "Allow", "an input is read-only"
        assert _decide(policy, "s3:GetObject", f"{outs}/results/node-1/model.pt") != "Allow"
        assert _decide(policy, "s3:PutObject", f"{outs}/elsewhere/x") != "Allow"
        assert _decide(policy, "s3:DeleteObject", f"{outs}/results/x") != "Allow"
    finally:
        provider.teardown(handle, journal)
    assert node_roles(moto) == [], "the role goes with both its inline policies"
