"""AWS provider and S3 channel against moto in server mode: what each launch looks like, how errors
are classified, teardown, gc and the bucket."""

from __future__ import annotations

import gzip
import json
import os
import random
import stat
import string
import subprocess
import urllib.parse
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpucloud.contract.provider import (
    TAG_EXPIRES,
    TAG_RUN,
    CandidateError,
    CapacityError,
    FatalProvisionError,
    ImageMissingError,
    PriceError,
    QuotaError,
    RunHandle,
    ThrottledError,
)
from tests.support.aws_faults import Fault
from tests.support.aws_inproc import hooks, journal, provider  # noqa: F401  (fixtures)
from tests.support.aws_requests import make_request
from tests.support.moto_server import moto, moto_server, tagged_alive, user_data_of  # noqa: F401

pytestmark = pytest.mark.slow


def instance(moto, iid, region="us-east-1"):  # noqa: F811
    return moto.client("ec2", region).describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]


def test_launch_is_locked_down_and_tagged(moto, provider, journal, hooks):  # noqa: F811
    req = make_request(spot=True)
    handle = provider.provision(req, journal)
    [iid] = handle.nodes
    try:
        ec2 = moto.client("ec2")
        inst = instance(moto, iid)
        # IMDSv2 only, hop limit 1
        assert inst["MetadataOptions"]["HttpTokens"] == "required"
        assert inst["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
        # the VM's shutdown ends the bill
        attr = ec2.describe_instance_attribute(InstanceId=iid, Attribute="instanceInitiatedShutdownBehavior")
        assert attr["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
        # encrypted gp3 root of disk_gb
        [vol] = ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id", "Values": [iid]}])["Volumes"]
        assert vol["Encrypted"] and vol["VolumeType"] == "gp3" and vol["Size"] == 120
        # the security group has no inbound rule at all
        [sg] = inst["SecurityGroups"]
        group = ec2.describe_security_groups(GroupIds=[sg["GroupId"]])["SecurityGroups"][0]
        assert group["IpPermissions"] == []
        # tags on instance, volume and security group
        for tags in (inst["Tags"], vol["Tags"], group["Tags"]):
            d = {t["Key"]: t["Value"] for t in tags}
            assert (
                d[TAG_RUN] == req.run_id
                and d[TAG_EXPIRES] == req.tags[TAG_EXPIRES]
                and d["Name"].startswith("gpucloud-")
            )
        # no key pair without ssh
        assert ec2.describe_key_pairs(Filters=[{"Name": f"tag:{TAG_RUN}", "Values": [req.run_id]}])["KeyPairs"] == []
        # spot without a max price: the job set none, so AWS caps at the on-demand price (no stale bid)
        [call] = hooks.ops("RunInstances")
        opts = call.params["InstanceMarketOptions"]
        assert opts["MarketType"] == "spot" and "MaxPrice" not in opts["SpotOptions"]
        assert inst.get("InstanceLifecycle") == "spot"
        assert call.params["MinCount"] == call.params["MaxCount"] == 1
        # the journal knows everything
        kinds = sorted(r.kind for r in journal.resources(req.run_id))
        assert kinds == ["instance", "node-role", "schedule", "security-group"]  # schedule: the deadline layer (c)
        assert provider.node_states(handle) in (["running"], ["pending"])
        assert handle.region == "us-east-1" and handle.zone and handle.attempt == 0 and handle.complete
        # single node: no placement group, no key; node-role: its own identity (identity.py)
        assert list(handle.resources) == ["security-group", "node-role", "schedule"]
        assert RunHandle.from_json(handle.to_json()) == handle
    finally:
        provider.teardown(handle, journal)
    assert tagged_alive(moto, req.run_id) == []
    assert provider.node_states(handle) == ["gone"]
    assert journal.resources(req.run_id) == []


def test_per_rank_user_data_is_refused_before_anything_is_created(moto, provider, journal, hooks):  # noqa: F811
    """N nodes come from one RunInstances call (tests/providers/aws/test_aws_multinode.py): they can only boot
    one shared script, so a request with a script per rank is a caller's bug, caught up front."""
    req = make_request()
    req.user_data = ["#!/bin/bash\necho rank 0\n", "#!/bin/bash\necho rank 1\n"]
    with pytest.raises(ValueError, match="one user-data for all"):
        provider.provision(req, journal)
    assert hooks.calls == [] and journal.resources(req.run_id) == []


def test_image_resolution(moto, provider, hooks):  # noqa: F811
    ssm_ami, _ = provider.resolve_image("us-east-1", "20.04")
    assert hooks.ops("GetParameter")[-1].params["Name"].endswith("/20.04/stable/current/amd64/hvm/ebs-gp2/ami-id")
    img = moto.client("ec2").describe_images(ImageIds=[ssm_ami])["Images"][0]
    assert "focal-20.04" in img["Name"] and img["OwnerId"] == "099720109477"
    # 22.04 has no SSM parameter in the fake: the Canonical-owner fallback finds it
    jammy, root = provider.resolve_image("us-east-1", "22.04")
    assert "jammy-22.04" in moto.client("ec2").describe_images(ImageIds=[jammy])["Images"][0]["Name"]
    assert root.startswith("/dev/")
    assert hooks.ops("DescribeImages")[-2].params["Owners"] == ["099720109477"]
    # `image:` from the job file wins
    assert provider.resolve_image("us-east-1", "20.04", jammy)[0] == jammy
    with pytest.raises(ImageMissingError, match="does not exist"):  # this region's candidate, not all of AWS
        provider.resolve_image("us-east-1", "20.04", "ami-0123456789abcdef0")
    with pytest.raises(FatalProvisionError, match="not an AMI"):
        provider.resolve_image("us-east-1", "20.04", "Canonical:ubuntu:22_04-lts:latest")


def test_k80_stack_gets_ubuntu_2004_from_ssm(moto, provider, journal, hooks):  # noqa: F811
    """The Kepler stack (R470, CUDA 11.4) needs Ubuntu 20.04; the AMI follows the stack, not the
    instance type. AWS no longer sells K80s (p2), so the K80 stack rides on a current instance."""
    from dataclasses import replace

    from gpucloud.plan.stacks import resolve_stack

    req = make_request(gpu="T4:1")
    kepler = resolve_stack("K80")
    assert kepler.ubuntu_version == "20.04" and req.ubuntu != "20.04"
    handle = provider.provision(replace(req, ubuntu=kepler.ubuntu_version), journal)
    [iid] = handle.nodes
    try:
        ami = instance(moto, iid)["ImageId"]
        assert ami == provider.resolve_image("us-east-1", "20.04")[0]
        assert ami != provider.resolve_image("us-east-1", req.ubuntu)[0]
        assert instance(moto, iid)["InstanceType"] == req.instance_type
    finally:
        provider.teardown(handle, journal)


def test_large_user_data_is_gzipped_under_16k(moto, provider, journal):  # noqa: F811
    filler = "".join(f"echo line {i} of a long setup script\n" for i in range(1500))  # ~50 KB raw
    script = "#!/bin/bash\n" + filler
    assert len(script.encode()) > 16 * 1024
    req = make_request(script=script)
    handle = provider.provision(req, journal)
    [iid] = handle.nodes
    try:
        import base64

        raw = base64.b64decode(
            moto.client("ec2").describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"]["Value"]
        )
        assert len(raw) <= 16 * 1024 and raw[:2] == b"\x1f\x8b"
        assert gzip.decompress(raw).decode() == script
        assert user_data_of(moto, iid) == script.encode()
    finally:
        provider.teardown(handle, journal)
    # small scripts go as they are
    from gpucloud.providers.aws import fit_user_data

    assert fit_user_data("#!/bin/bash\necho hi\n") == b"#!/bin/bash\necho hi\n"


def test_user_data_too_big_even_gzipped_is_a_clear_error(moto, provider, journal):  # noqa: F811
    rng = random.Random(4)
    noise = "".join(rng.choice(string.ascii_letters) for _ in range(40_000))
    req = make_request(script=f"#!/bin/bash\n# {noise}\n")
    from gpucloud.errors import UserError

    with pytest.raises(UserError, match="user-data limit") as info:
        provider.provision(req, journal)
    assert "script inside `workdir`" in (info.value.hint or "")
    assert tagged_alive(moto, req.run_id) == []


def test_client_token_is_stable_across_retries_and_idempotent(moto, provider, journal, hooks):  # noqa: F811
    hooks.add(Fault("RunInstances", "RequestLimitExceeded", times=2))
    req = make_request()
    handle = provider.provision(req, journal)
    [iid] = handle.nodes
    calls = hooks.ops("RunInstances")
    assert [c.injected for c in calls] == ["RequestLimitExceeded", "RequestLimitExceeded", None]
    tokens = {c.params["ClientToken"] for c in calls}
    assert len(tokens) == 1 and len(next(iter(tokens))) <= 64
    # the same attempt again (a retried provision): AWS answers with the same instance
    assert provider.provision(req, journal).nodes == [iid]
    assert hooks.ops("RunInstances")[-1].params["ClientToken"] in tokens
    # another attempt gets another token
    from gpucloud.providers.aws import client_token

    assert client_token(req.run_id, 1, "us-east-1a", None) != client_token(req.run_id, 0, "us-east-1a", None)
    provider.teardown(handle, journal)
    assert tagged_alive(moto, req.run_id) == []


def test_capacity_in_one_zone_moves_to_the_next(moto, provider, journal, hooks):  # noqa: F811
    hooks.add(Fault("RunInstances", "InsufficientInstanceCapacity", times=1))
    req = make_request()
    handle = provider.provision(req, journal)
    [iid] = handle.nodes
    zones = [c.params.get("SubnetId") for c in hooks.ops("RunInstances")]
    assert len(zones) == 2 and zones[0] != zones[1]
    assert instance(moto, iid)["SubnetId"] == zones[1]
    provider.teardown(handle, journal)


@pytest.mark.parametrize(
    ("code", "cls", "quota"),
    [
        ("InsufficientInstanceCapacity", CapacityError, None),
        ("Server.InsufficientInstanceCapacity", CapacityError, None),
        ("InsufficientHostCapacity", CapacityError, None),
        ("InsufficientCapacity", CapacityError, None),
        ("UnfulfillableCapacity", CapacityError, None),
        ("Unsupported", CapacityError, None),
        ("VcpuLimitExceeded", QuotaError, "L-DB2E81BA"),
        ("Client.VcpuLimitExceeded", QuotaError, "L-DB2E81BA"),
        ("InstanceLimitExceeded", QuotaError, "L-DB2E81BA"),
        ("SpotMaxPriceTooLow", PriceError, None),
        ("RequestLimitExceeded", ThrottledError, None),
        ("InternalError", ThrottledError, None),
        ("UnauthorizedOperation", FatalProvisionError, None),
        ("OptInRequired", FatalProvisionError, None),
        ("InvalidAMIID.NotFound", CandidateError, None),
        ("InvalidParameterValue", CandidateError, None),
        ("UnsupportedOperation", CandidateError, None),
        ("InsufficientFreeAddressesInSubnet", CapacityError, None),
        ("SomeCodeNobodyDocumented", CandidateError, None),
    ],
)
def test_error_classification(code, cls, quota):
    from botocore.exceptions import ClientError

    from gpucloud.providers.aws import classify

    exc = ClientError({"Error": {"Code": code, "Message": "m"}}, "RunInstances")
    err = classify(exc, region="us-east-1", instance_type="g4dn.xlarge", spot=False, what="launching")
    assert type(err) is cls
    assert err.quota_code == quota
    if quota:
        assert quota in err.message and quota in (err.hint or "")


@pytest.mark.parametrize(
    ("itype", "spot", "quota"),
    [
        ("p2.xlarge", False, "L-417A185B"),
        ("p5.48xlarge", False, "L-417A185B"),
        ("g4dn.xlarge", False, "L-DB2E81BA"),
        ("g6e.xlarge", False, "L-DB2E81BA"),
        ("vt1.3xlarge", False, "L-DB2E81BA"),
        ("p2.xlarge", True, "L-7212CCBC"),
        ("g5.xlarge", True, "L-3819A6DF"),
        ("vt1.3xlarge", True, "L-3819A6DF"),
    ],
)
def test_quota_codes(itype, spot, quota):
    from gpucloud.providers.aws import quota_for

    assert quota_for(itype, spot)[0] == quota


@pytest.mark.parametrize("kind", ["quota", "throttle", "fatal"])
def test_failed_launch_cleans_up_its_attempt(moto, provider, journal, hooks, kind):  # noqa: F811
    code = {"quota": "MaxSpotInstanceCountExceeded", "throttle": "RequestLimitExceeded", "fatal": "OptInRequired"}[kind]
    hooks.add(Fault("RunInstances", code, times=None))
    req = make_request(spot=True)
    with pytest.raises((QuotaError, ThrottledError, FatalProvisionError)) as info:
        provider.provision(req, journal)
    assert info.value.kind == kind
    if kind == "quota":
        assert info.value.quota_code == "L-3819A6DF"
    if kind == "throttle":
        assert len(hooks.ops("RunInstances")) == provider.retry_attempts
    assert tagged_alive(moto, req.run_id) == []
    assert journal.resources(req.run_id) == []


def test_a_refused_permission_skips_aws_naming_the_action(moto, provider, journal, hooks):  # noqa: F811
    from gpucloud.providers.aws.access import PermissionDenied

    hooks.add(Fault("RunInstances", "UnauthorizedOperation", times=None))
    req = make_request()
    with pytest.raises(PermissionDenied) as info:
        provider.provision(req, journal)
    assert info.value.exit_code == 78 and info.value.action == "ec2:RunInstances"
    assert "ec2:RunInstances" in info.value.message and "iam-policy aws" in (info.value.hint or "")
    assert tagged_alive(moto, req.run_id) == []


@pytest.mark.parametrize(
    "message", ["Not authorized for images: [ami-0123456789abcdef0]", "You are not authorized to use this image"]
)
def test_auth_failure_on_an_image_concerns_the_candidate_not_the_credentials(message: str) -> None:
    from botocore.exceptions import ClientError

    from gpucloud.providers.aws import classify
    from gpucloud.providers.aws.access import classify_access

    exc = ClientError({"Error": {"Code": "AuthFailure", "Message": message}}, "RunInstances")
    assert classify_access(exc) is None
    err = classify(exc, region="us-east-1", instance_type="g4dn.xlarge", spot=False, what="launching")
    assert type(err) is CandidateError and err.kind == "candidate"
    bad_keys = ClientError(
        {"Error": {"Code": "AuthFailure", "Message": "AWS was not able to validate the provided access credentials"}},
        "DescribeInstances",
    )
    assert classify_access(bad_keys).kind == "credentials"


def test_spot_max_price_is_sent_only_when_the_job_sets_one(moto, provider, journal, hooks):  # noqa: F811
    req = make_request(spot=True)
    req.max_price_per_hour = 0.3
    handle = provider.provision(req, journal)
    try:
        [call] = hooks.ops("RunInstances")
        assert call.params["InstanceMarketOptions"]["SpotOptions"]["MaxPrice"] == "0.3000"
    finally:
        provider.teardown(handle, journal)


def test_ssh_opens_22_to_the_caller_only_with_a_private_key(moto, provider, journal, gpucloud_home):  # noqa: F811
    req = make_request(ssh=True)
    handle = provider.provision(req, journal)
    [iid] = handle.nodes
    ec2 = moto.client("ec2")
    inst = instance(moto, iid)
    group = ec2.describe_security_groups(GroupIds=[inst["SecurityGroups"][0]["GroupId"]])["SecurityGroups"][0]
    [perm] = group["IpPermissions"]
    assert (perm["FromPort"], perm["ToPort"], perm["IpRanges"][0]["CidrIp"]) == (22, 22, "203.0.113.7/32")
    [kp] = ec2.describe_key_pairs(Filters=[{"Name": f"tag:{TAG_RUN}", "Values": [req.run_id]}])["KeyPairs"]
    assert inst["KeyName"] == kp["KeyName"]
    key = provider.key_path(req.run_id, "us-east-1", 0)
    assert key.is_relative_to(gpucloud_home)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and "PRIVATE KEY" in key.read_text()
    assert handle.resources["key-pair"] == [kp["KeyName"]]
    provider.teardown(handle, journal)
    provider.teardown(handle, journal)  # idempotent
    assert tagged_alive(moto, req.run_id) == []
    assert not key.exists()


def test_ssh_without_a_public_address_says_what_to_do(moto, journal, hooks, monkeypatch):  # noqa: F811
    from gpucloud.providers.aws import AwsProvider

    def offline() -> str:
        raise OSError("network unreachable")

    monkeypatch.delenv("GPUCLOUD_SSH_CIDR", raising=False)
    provider = AwsProvider(public_ip=offline, retry_base_s=0.01, sleep=lambda s: None)
    req = make_request(ssh=True)
    with pytest.raises(FatalProvisionError, match="public IP") as info:
        provider.provision(req, journal)
    assert "GPUCLOUD_SSH_CIDR" in (info.value.hint or "")
    assert tagged_alive(moto, req.run_id) == []
    monkeypatch.setenv("GPUCLOUD_SSH_CIDR", "198.51.100.0/24")
    req = make_request(ssh=True)
    handle = provider.provision(req, journal)
    groups = moto.client("ec2").describe_security_groups(Filters=[{"Name": f"tag:{TAG_RUN}", "Values": [req.run_id]}])[
        "SecurityGroups"
    ]
    assert groups[0]["IpPermissions"][0]["IpRanges"][0]["CidrIp"] == "198.51.100.0/24"
    provider.teardown(handle, journal)


def test_teardown_retries_dependency_violation_and_is_idempotent(moto, provider, journal, hooks):  # noqa: F811
    req = make_request()
    handle = provider.provision(req, journal)
    hooks.add(Fault("DeleteSecurityGroup", "DependencyViolation", times=3))
    provider.teardown(handle, journal)
    assert [c.injected for c in hooks.ops("DeleteSecurityGroup")] == ["DependencyViolation"] * 3 + [None]
    assert tagged_alive(moto, req.run_id) == []
    provider.teardown(handle, journal)
    provider.teardown(RunHandle("never-existed", "aws", "us-east-1"), journal)
    provider.teardown(RunHandle("never-existed", "aws", "us-east-1", complete=False), journal)


def test_single_node_teardown_works_on_plain_moto(moto, journal, gpucloud_home):  # noqa: F811
    """Teardown calls only the APIs for the kinds the handle lists, so a single-node run
    (no placement group) comes down against plain moto, which has no placement-group API (no test
    hooks at all here: not even the recorder). The same for a partial handle rebuilt after a crash."""
    import boto3

    from gpucloud.providers.aws import AwsProvider
    from tests.support.aws_faults import unhooked

    with unhooked():
        session = boto3.Session()
    provider = AwsProvider(session=session, retry_base_s=0.01, poll_s=0.05, sleep=lambda s: None)
    provider.TERMINATE_TIMEOUT_S = provider.SG_DELETE_TIMEOUT_S = 5.0
    for complete in (True, False):
        req = make_request()
        handle = provider.provision(req, journal)
        if not complete:
            handle = RunHandle(req.run_id, "aws", handle.region, attempt=handle.attempt, complete=False)
        provider.teardown(handle, journal)
        assert tagged_alive(moto, req.run_id) == []
        assert journal.resources(req.run_id) == []


def test_a_partial_handle_has_the_states_of_its_own_attempts_machines(moto, provider, journal, hooks):  # noqa: F811
    """A relaunch cut short before its handle was stored is asked about by a handle without nodes:
    its own instance, found by the run and attempt tags, not the preempted attempt's (terminated)."""
    import dataclasses

    req = make_request(spot=True)
    first = provider.provision(req, journal)
    provider.teardown(first, journal)  # the preempted attempt: its instance is terminated
    second = provider.provision(dataclasses.replace(req, attempt=1), journal)
    try:
        partial = RunHandle(req.run_id, "aws", req.region, attempt=1, complete=False)
        assert provider.node_states(partial) in (["running"], ["pending"])
        assert provider.node_states(RunHandle(req.run_id, "aws", req.region, attempt=0, complete=False)) == ["gone"]
        # an attempt whose follower died before RunInstances has no machine at all: gone, not unknown
        assert provider.node_states(RunHandle(req.run_id, "aws", req.region, attempt=2, complete=False)) == ["gone"]
    finally:
        provider.teardown(second, journal)
    assert provider.node_states(partial) == ["gone"]


def test_teardown_without_waiting(moto, provider, journal):  # noqa: F811
    req = make_request()
    handle = provider.provision(req, journal)
    provider.teardown(handle, journal, wait=False)
    assert provider.node_states(handle) == ["gone"]
    provider.teardown(handle, journal)  # what `down`/gc do later: finishes the rest
    assert tagged_alive(moto, req.run_id) == []


def test_teardown_failure_is_reported_and_a_second_teardown_finishes(moto, provider, journal, hooks):  # noqa: F811
    from gpucloud.providers.aws import AwsTeardownError

    req = make_request()
    handle = provider.provision(req, journal)
    hooks.add(Fault("TerminateInstances", "UnauthorizedOperation", times=1))
    with pytest.raises(AwsTeardownError, match="incomplete") as info:
        provider.teardown(handle, journal)
    assert f"gpucloud down {req.run_id}" in (info.value.hint or "")
    assert tagged_alive(moto, req.run_id)
    provider.teardown(handle, journal)
    assert tagged_alive(moto, req.run_id) == []


def test_gc_sweeps_expired_resources_in_every_region(moto, provider, journal, hooks):  # noqa: F811
    from gpucloud.contract.provider import expiry_tag as iso_utc

    expired = [
        make_request(region="us-west-2", expires_in=timedelta(minutes=-5)),
        make_request(region="eu-west-1", expires_in=timedelta(minutes=-1)),
    ]
    fresh = make_request(region="us-east-1")
    handles = {req.run_id: provider.provision(req, journal) for req in (*expired, fresh)}
    # a stray volume and key pair (as a crash might leave them)
    ec2 = moto.client("ec2", "ap-northeast-1")
    stray = [
        {"Key": TAG_RUN, "Value": "stray"},
        {"Key": TAG_EXPIRES, "Value": iso_utc(datetime.now(UTC) - timedelta(hours=1))},
    ]
    vol = ec2.create_volume(
        AvailabilityZone="ap-northeast-1a", Size=10, TagSpecifications=[{"ResourceType": "volume", "Tags": stray}]
    )["VolumeId"]
    ec2.create_key_pair(KeyName="gpucloud-stray", TagSpecifications=[{"ResourceType": "key-pair", "Tags": stray}])
    now = datetime.now(UTC)
    hooks.calls.clear()

    dry = provider.gc(now, dry_run=True)
    assert all(line.split(": ", 1)[1].startswith("would delete") for line in dry), dry
    for req in expired:
        assert any(req.run_id in line and "instance" in line for line in dry)
        # each region's node role, found in the one listing by its path
        assert any(
            line.startswith(f"aws/{req.region}: ") and "node role" in line and req.run_id in line for line in dry
        )
        assert tagged_alive(moto, req.run_id)
    # IAM is global: one client and one listing, not one per region of the catalog
    assert [c.region for c in hooks.ops("ListRoles")] == ["us-east-1"]
    assert {c.region for c in hooks.calls if c.service == "iam"} == {"us-east-1"}
    assert any(vol in line for line in dry) and any("gpucloud-stray" in line for line in dry)
    assert not any(fresh.run_id in line for line in dry)
    regions_called = {c.region for c in hooks.ops("DescribeInstances")}
    assert regions_called >= {"us-east-1", "us-west-2", "eu-west-1", "ap-northeast-1"}

    done = provider.gc(now, dry_run=False)
    assert len(done) == len(dry) and all("deleted" in line for line in done), done
    for req in expired:
        assert tagged_alive(moto, req.run_id) == []
    assert tagged_alive(moto, "stray") == []
    assert tagged_alive(moto, fresh.run_id)  # not expired: untouched
    provider.teardown(handles[fresh.run_id], journal)


def test_temporary_credentials_that_end_before_the_deadline_warn(moto, journal, monkeypatch):  # noqa: F811
    import boto3

    from gpucloud.providers.aws import AwsProvider

    soon = (datetime.now(UTC) + timedelta(minutes=20)).strftime("%Y-%m-%dT%H:%M:%SZ")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token")
    monkeypatch.setenv("AWS_CREDENTIAL_EXPIRATION", soon)
    warnings: list[str] = []
    provider = AwsProvider(session=boto3.Session(), warn=warnings.append, retry_base_s=0.01, sleep=lambda s: None)
    req = make_request(expires_in=timedelta(hours=3))
    handle = provider.provision(req, journal)
    warnings = [w for w in warnings if "credentials" in w]  # not the image fallback's warning
    try:
        assert len(warnings) == 1
        assert "expire" in warnings[0] and "deadline" in warnings[0]
        assert "cannot follow it or tear it down" in warnings[0]  # env credentials do not refresh
        assert "presigned" not in warnings[0] and "run itself goes on" in warnings[0]  # the node has its role
    finally:
        provider.teardown(handle, journal)
    # long enough: no warning
    warnings.clear()
    later = (datetime.now(UTC) + timedelta(hours=12)).strftime("%Y-%m-%dT%H:%M:%SZ")
    monkeypatch.setenv("AWS_CREDENTIAL_EXPIRATION", later)
    provider = AwsProvider(session=boto3.Session(), warn=warnings.append)
    provider._check_credentials("x", datetime.now(UTC) + timedelta(hours=3), None)
    assert warnings == []
    # long-term keys never warn
    monkeypatch.delenv("AWS_SESSION_TOKEN")
    monkeypatch.setenv("AWS_CREDENTIAL_EXPIRATION", soon)
    AwsProvider(session=boto3.Session(), warn=warnings.append)._check_credentials(
        "y", datetime.now(UTC) + timedelta(hours=3), None
    )
    assert warnings == []


# ---- S3 channel -------------------------------------------------------------------------------------


def test_bucket_is_private_encrypted_and_expires_runs(moto, provider):  # noqa: F811
    chan = provider.channel("eu-west-1")
    assert chan.bucket == "gpucloud-123456789012-eu-west-1"
    s3 = moto.client("s3", "eu-west-1")
    pab = s3.get_public_access_block(Bucket=chan.bucket)["PublicAccessBlockConfiguration"]
    assert all(pab[k] for k in ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets"))
    enc = s3.get_bucket_encryption(Bucket=chan.bucket)["ServerSideEncryptionConfiguration"]["Rules"][0]
    assert enc["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    [rule] = s3.get_bucket_lifecycle_configuration(Bucket=chan.bucket)["Rules"]
    assert rule["Status"] == "Enabled" and rule["Expiration"]["Days"] == 30 and rule["Filter"]["Prefix"] == "runs/"
    assert s3.get_bucket_location(Bucket=chan.bucket)["LocationConstraint"] == "eu-west-1"
    # a second process (a new channel) reuses it
    from gpucloud.providers.aws.channel import S3Channel

    again = S3Channel(provider.session, "eu-west-1")
    again.put_bytes("runs/x/a", b"1")
    assert chan.get_bytes("runs/x/a") == b"1" and chan.get_bytes("runs/x/missing") is None
    chan.delete_prefix("runs/x/")
    assert chan.get_bytes("runs/x/a") is None


def test_presigned_urls_work_with_curl_and_expire_with_the_run(moto, provider, tmp_path):  # noqa: F811
    chan = provider.channel("us-east-1")
    deadline = datetime.now(UTC) + timedelta(hours=2)
    put = chan.url_put("runs/curl/node-0/status.json", deadline)
    get = chan.url_get("runs/curl/node-0/status.json", deadline)
    q = urllib.parse.parse_qs(urllib.parse.urlparse(put).query)
    assert q["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
    assert 7000 <= int(q["X-Amz-Expires"][0]) <= 7200
    body = tmp_path / "status.json"
    body.write_text(json.dumps({"state": "running"}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # the VM has no credentials
    subprocess.run(["curl", "-fsS", "-T", str(body), put], check=True, env=env, timeout=30)
    out = subprocess.run(["curl", "-fsS", get], check=True, env=env, capture_output=True, timeout=30).stdout
    assert json.loads(out) == {"state": "running"}
    # SigV4 URLs live at most 7 days, whatever the deadline
    far = chan.url_get("runs/curl/x", datetime.now(UTC) + timedelta(days=30))
    assert urllib.parse.parse_qs(urllib.parse.urlparse(far).query)["X-Amz-Expires"] == [str(7 * 86400)]
    # the run-level protocol on top of the primitives
    urls = chan.prepare("curl", 1, deadline)
    manifest = subprocess.run(
        ["curl", "-fsS", urls[0]], check=True, env=env, capture_output=True, timeout=30
    ).stdout.decode()
    assert manifest.startswith("deadline ") and "status_put http" in manifest


def test_s3_throttling_backs_off_then_becomes_a_provision_error(moto, provider, hooks):  # noqa: F811
    from gpucloud.providers.aws.access import PermissionDenied
    from gpucloud.providers.aws.channel import S3Channel

    S3Channel.RETRY_BASE_S, saved = 0.001, S3Channel.RETRY_BASE_S
    try:
        chan = provider.channel("us-east-1")
        hooks.add(Fault("PutObject", "SlowDown", times=2))
        chan.put_bytes("runs/t/a", b"x")
        assert chan.get_bytes("runs/t/a") == b"x"
        hooks.add(Fault("PutObject", "SlowDown", times=None))
        with pytest.raises(ThrottledError, match="SlowDown"):
            chan.put_bytes("runs/t/b", b"x")
        hooks.reset()
        hooks.add(Fault("PutObject", "AccessDenied", times=1))
        with pytest.raises(PermissionDenied, match="AccessDenied") as info:  # the policy lacks it: exit 78
            chan.put_bytes("runs/t/c", b"x")
        assert info.value.action == "s3:PutObject" and info.value.exit_code == 78
    finally:
        S3Channel.RETRY_BASE_S = saved


def test_iam_policy_command_prints_the_policy():
    from typer.testing import CliRunner

    from gpucloud.cli.app import app
    from gpucloud.providers.aws.policy import policy_document

    res = CliRunner().invoke(app, ["iam-policy", "aws"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc == policy_document() and doc["Version"] == "2012-10-17"
    assert (
        "boto3"
        not in Path(__import__("gpucloud.providers.aws.policy").providers.aws.policy.__file__)
        .read_text()
        .split('"""', 2)[2]
    )


# ---- a dead endpoint fails fast ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_dead_endpoint_fails_within_20_seconds(kind, gpucloud_home, monkeypatch):
    """An AWS endpoint that refuses connections, or accepts and never answers, costs the launch
    seconds, not minutes: bounded botocore timeouts under one retrying call (docs/PROVIDERS.md)."""
    import time

    import boto3

    from gpucloud.errors import EndpointError
    from gpucloud.providers.aws import AwsProvider
    from gpucloud.state.runs_db import Journal, Store
    from tests.support.aws_faults import unhooked
    from tests.support.dead_endpoint import dead_endpoint

    for key, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    req, journal = make_request(), Journal(Store())
    with dead_endpoint(kind) as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        with unhooked():
            session = boto3.Session()
        provider = AwsProvider(session=session)  # the product's own waits, not the tests' short ones
        t0 = time.monotonic()
        with pytest.raises(EndpointError, match="could not reach") as info:  # skip AWS, not a throttle
            provider.provision(req, journal)
    assert time.monotonic() - t0 < 20, info.value
    assert url.split("//")[1] in info.value.message and "AWS_ENDPOINT_URL" in (info.value.hint or "")


def test_aws_declares_its_shape():
    """What the lifecycle and the renderer need is declared, not probed with getattr."""
    from gpucloud.contract.provider import Provider
    from gpucloud.contract.registry import get_provider

    provider = get_provider("aws")
    assert isinstance(provider, Provider)
    caps = provider.capabilities
    assert caps.shared_user_data and caps.spot and caps.multi_node
    assert (caps.user_data_limit, caps.user_data_encoding, caps.self_termination) == (16384, "raw", "shutdown")
    assert caps.preemption_notice == "aws-imds-spot"
    assert provider.master_port() == 29500
    for gone in ("shared_user_data", "poll_interval"):
        assert not hasattr(type(provider), gone)
    handle = RunHandle("r1", "aws", "eu-west-1", nodes=["i-0abc", "i-0def"])
    assert "--instance-id i-0def" in provider.console_hint(handle, 1) and "eu-west-1" in provider.console_hint(
        handle, 1
    )
    hint = provider.console_hint(RunHandle("r1", "aws", "eu-west-1", complete=False), 0)
    assert "Values=r1" in hint and "--region eu-west-1" in hint
