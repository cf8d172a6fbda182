"""The IAM policy of `gpucloud iam-policy aws` allows every AWS operation gpucloud makes, and little
more.

Every operation is recorded through botocore events: those of the end-to-end tests that ran earlier
in this session (in-process and subprocess CLIs) plus a run of our own that touches every feature
(ssh key pair and rule, a fresh bucket, run + logs, detach + down, a 2-node run with its placement
group and intra-run rule, gc of an expired volume).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpucloud.providers.aws.policy import policy_document
from tests.support.aws_faults import HOOKS, SESSION_RECORD, recorded_ops
from tests.support.aws_runs import drop_bucket, invoke, run_id_in, write_aws_job  # noqa: F401
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.iam_eval import Request, allowed, as_list, decide, is_allowed, statements
from tests.support.moto_server import Moto, moto, moto_server, tagged_alive  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

# API operation -> IAM action where the names differ (the rest is "<prefix>:<Operation>").
ACTION_OF = {
    ("service-quotas", "GetServiceQuota"): "servicequotas:GetServiceQuota",
    ("service-quotas", "GetAWSDefaultServiceQuota"): "servicequotas:GetAWSDefaultServiceQuota",
    ("s3", "HeadBucket"): "s3:ListBucket",
    ("s3", "ListObjectsV2"): "s3:ListBucket",
    ("s3", "PutPublicAccessBlock"): "s3:PutBucketPublicAccessBlock",
    ("s3", "PutBucketEncryption"): "s3:PutEncryptionConfiguration",
    ("s3", "PutBucketLifecycleConfiguration"): "s3:PutLifecycleConfiguration",
    ("s3", "DeleteObjects"): "s3:DeleteObject",
    ("s3", "CreateMultipartUpload"): "s3:PutObject",
    ("s3", "UploadPart"): "s3:PutObject",
    ("s3", "CompleteMultipartUpload"): "s3:PutObject",
}
# Allowed although the tests may not exercise them, with the reason.
NOT_EXERCISED = {
    "s3:AbortMultipartUpload": "a failed multipart upload of a code tarball above 64 MiB",
    "s3:DeleteObject": "Channel.delete_prefix (unit-tested, not called by the CLI commands)",
    "iam:CreateServiceLinkedRole": "no call of its own: EC2 creates the Spot service-linked role with the "
    "caller's permissions on an account's first spot launch (evaluated below)",
    **{
        action: "`catalog refresh`, not part of a run: tests/providers/aws/test_aws_iam_catalog.py runs it "
        "under IAM enforcement with only this policy"
        for action in ("ec2:DescribeInstanceTypes", "ec2:DescribeSpotPriceHistory", "pricing:GetProducts")
    },
    **{
        action: "an EFA multi-node launch (Elastic IPs, the egress rule to the group itself, the type's "
        "network cards): tests/providers/aws/test_aws_efa.py runs one on moto and checks every call against this policy"
        for action in (
            "ec2:AllocateAddress",
            "ec2:AssociateAddress",
            "ec2:DescribeAddresses",
            "ec2:ReleaseAddress",
            "ec2:AuthorizeSecurityGroupEgress",
        )
    },
    **{
        action: "`check` reads the pieces `setup aws` created (none here): tests/providers/aws/test_aws_guide.py "
        "runs setup, then check, under IAM enforcement with only the runner policies"
        for action in ("iam:GetPolicyVersion", "iam:GetRolePolicy")
    },
    "iam:PassRole": "no call of its own: AWS checks it on CreateSchedule for the role the schedule names "
    "(the evaluator checks that request below)",
    **{
        action: "no call of its own: IAM checks it on a create call that carries tags (the node role's)"
        for action in ("iam:TagRole", "iam:TagInstanceProfile")
    },
    "iam:ListRoleTags": "gc finding an expired node role: tests/providers/aws/test_aws_node_identity.py",
}


def iam_action(service: str, operation: str) -> str:
    return ACTION_OF.get((service, operation), f"{service}:{operation}")


def allowed_actions(doc: dict[str, Any]) -> set[str]:
    return {a for s in statements(doc) for a in as_list(s["Action"])}


def test_policy_is_well_formed_and_tight() -> None:
    doc = policy_document()
    assert doc["Version"] == "2012-10-17"
    json.dumps(doc)  # plain data
    for s in doc["Statement"]:
        assert s["Effect"] == "Allow" and s.get("Sid")
        for a in as_list(s["Action"]):
            assert "*" not in a, f"no wildcard actions: {a}"
        if "iam:PassRole" in as_list(s["Action"]):  # the deadline role to the scheduler, node roles to EC2
            passed = {
                "arn:aws:iam::*:role/gpucloud-deadline": "scheduler.amazonaws.com",  # in its own account
                "arn:aws:iam::*:role/gpucloud/*": "ec2.amazonaws.com",  # identity.py's path
            }
            assert s["Resource"] in passed
            assert s["Condition"] == {"StringEquals": {"iam:PassedToService": passed[s["Resource"]]}}
    # destroying only what gpucloud tagged; creating only with the tag
    by_action = {a: s for s in statements(doc) for a in as_list(s["Action"])}
    for a in (
        "ec2:TerminateInstances",
        "ec2:DeleteSecurityGroup",
        "ec2:DeleteKeyPair",
        "ec2:DeletePlacementGroup",
        "ec2:DeleteVolume",
    ):
        assert by_action[a]["Condition"] == {"Null": {"aws:ResourceTag/gpucloud-run": "false"}}
    tag_stmt = by_action["ec2:CreateTags"]
    assert "ec2:CreateAction" in tag_stmt["Condition"]["StringEquals"]
    s3_resources = {
        r for s in statements(doc) if as_list(s["Action"])[0].startswith("s3:") for r in as_list(s["Resource"])
    }
    assert s3_resources == {
        "arn:aws:s3:::gpucloud-${aws:PrincipalAccount}-*",
        "arn:aws:s3:::gpucloud-${aws:PrincipalAccount}-*/runs/*",
    }


def test_every_operation_of_the_end_to_end_runs_is_allowed(
    inproc: None,
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,
    tmp_path: Path,
) -> None:
    from gpucloud.contract.provider import expiry_tag as iso_utc

    # Our own tour of every feature, so this test stands alone too.
    drop_bucket(moto, "us-east-1")
    job = write_aws_job(tmp_path / "job.yaml", run="echo policy-tour", ssh=True, name="policy")
    code, out = invoke("run", str(job), "--cloud", "aws")
    assert code == 0, out[-2000:]
    code, out = invoke("logs", run_id_in(out))
    assert code == 0 and "policy-tour" in out
    code, out = invoke("run", str(job), "--cloud", "aws", "--detach")
    assert code == 0, out[-2000:]
    code, out = invoke("down", run_id_in(out), "--yes")
    assert code == 0, out[-2000:]
    # Two nodes: the placement group and the security group's rule for the run's own nodes.
    nodes = write_aws_job(tmp_path / "nodes.yaml", run="echo node $GPUCLOUD_NODE_RANK", name="policy-nodes")
    nodes.write_text(nodes.read_text() + "num_nodes: 2\n")
    code, out = invoke("run", str(nodes), "--cloud", "aws")
    assert code == 0, out[-2000:]
    # Baked images: a builder run, its snapshot, and the image removed again.
    code, out = invoke("image", "build", str(job), "--cloud", "aws", "--region", "us-east-1", "--yes", "--json")
    assert code == 0, out[-2000:]
    ref = json.loads(out.strip().splitlines()[-1])["ref"]
    code, out = invoke("image", "rm", ref, "--cloud", "aws", "--region", "us-east-1")
    assert code == 0, out[-2000:]
    stray = [
        {"Key": "gpucloud-run", "Value": "policy-stray"},
        {"Key": "gpucloud-expires", "Value": iso_utc(datetime.now(UTC) - timedelta(hours=1))},
    ]
    moto.client("ec2").create_volume(
        AvailabilityZone="us-east-1a", Size=8, TagSpecifications=[{"ResourceType": "volume", "Tags": stray}]
    )
    # A deadline schedule long past its time (the cloud-side deadline layer): gc reads and deletes it.
    moto.client("scheduler").create_schedule(
        Name="gpucloud-policy-stray-0",
        GroupName="default",
        FlexibleTimeWindow={"Mode": "OFF"},
        ScheduleExpression=f"at({datetime.now(UTC) - timedelta(hours=3):%Y-%m-%dT%H:%M:%S})",
        Target={
            "Arn": "arn:aws:scheduler:::aws-sdk:ec2:terminateInstances",
            "Input": "{}",
            "RoleArn": "arn:aws:iam::123456789012:role/gpucloud-deadline",
        },
    )
    code, out = invoke("gc", "--yes")
    assert code == 0, out[-2000:]
    assert "deleted deadline schedule gpucloud-policy-stray-0" in out
    code, out = invoke("check", "--cloud", "aws")  # regions and GPU quotas
    assert code == 0, out[-2000:]
    assert tagged_alive(moto) == []

    # S3 objects used by our own runs are all under gpucloud-*/runs/
    for call in HOOKS.calls:
        if call.service == "s3" and "Key" in call.params:
            assert call.params["Bucket"].startswith("gpucloud-") and call.params["Key"].startswith("runs/"), call

    # The evaluator on the calls whose resources and conditions the policy narrows.
    account = moto.client("sts").get_caller_identity()["Account"]
    checked = 0
    # An ingress rule's group is one a CreateSecurityGroup of the same run tagged (its id is in the answer only).
    run_groups = {
        t["Value"]
        for call in HOOKS.calls
        if call.operation == "CreateSecurityGroup"
        for t in _tag_list(call.params, "security-group")
        if t["Key"] == "gpucloud-run"
    }
    for call in HOOKS.calls:
        if call.operation == "AuthorizeSecurityGroupIngress":
            run = _tags(call.params, "security-group-rule").get("gpucloud-run")
            call.params.setdefault("_group_tags", {"gpucloud-run": run} if run in run_groups else {})
        reqs = requests_of(
            call.service, call.operation, call.params, account, moto.region if hasattr(moto, "region") else "us-east-1"
        )
        if reqs:
            checked += 1
            assert allowed(doc := policy_document(), reqs), (
                call.operation,
                call.params,
                [(r.resource, decide(doc, r)) for r in reqs],
            )
    assert checked > 0

    ops = recorded_ops(SESSION_RECORD)
    # The VM's own calls go through presigned URLs, signed with the caller's permissions.
    ops |= {("s3", "GetObject"), ("s3", "PutObject")}
    doc = policy_document()
    actions = {iam_action(svc, op) for svc, op in ops}
    # A mount for a job that may run off AWS asks STS for a federation token: `iam-policy aws --data
    # JOB` grants it for such a job (providers/aws/mount.py), not the runner policy. The record holds
    # every subprocess CLI of this worker, so another test's mount job may have made it.
    data_only = {"sts:GetFederationToken"}
    missing = sorted(a for a in actions - data_only if not is_allowed(a, doc))
    assert missing == [], f"operations made but not in the policy: {missing}"
    # RunInstances / CreateSecurityGroup / CreateKeyPair / the ssh rule tag their resources
    creates = {
        op
        for svc, op in ops
        if svc == "ec2"
        and op
        in (
            "RunInstances",
            "CreateSecurityGroup",
            "CreateKeyPair",
            "AuthorizeSecurityGroupIngress",
            "CreatePlacementGroup",
        )
    }
    tag_cond = next(s for s in statements(doc) if "ec2:CreateTags" in as_list(s["Action"]))["Condition"]
    assert creates <= set(tag_cond["StringEquals"]["ec2:CreateAction"])
    # and little more: every allowed action was used, or is listed with the reason it was not
    unused = sorted(allowed_actions(doc) - actions - {"ec2:CreateTags"} - set(NOT_EXERCISED))
    assert unused == [], f"policy grants actions no run used: {unused}"
    print(
        f"\nIAM policy check: {len(ops)} distinct operations recorded, all allowed "
        f"({len(allowed_actions(doc))} actions in the policy)"
    )


# ---- the evaluator: what the policy allows, and what it must deny ----------------------------------

ACCOUNT = "123456789012"
REGION = "us-east-1"


def _tag_list(params: dict[str, Any], kind: str) -> list[dict[str, str]]:
    return [
        t
        for spec in params.get("TagSpecifications", [])
        if spec.get("ResourceType") == kind
        for t in spec.get("Tags", [])
    ]


def _tags(params: dict[str, Any], kind: str) -> dict[str, str]:
    return {
        t["Key"]: t["Value"]
        for spec in params.get("TagSpecifications", [])
        if spec.get("ResourceType") == kind
        for t in spec.get("Tags", [])
    }


def requests_of(
    service: str, operation: str, params: dict[str, Any], account: str = ACCOUNT, region: str = REGION
) -> list[Request]:
    """The IAM requests of one API call, for the calls the policy narrows (RunInstances, S3);
    [] for the others (checked by action above)."""
    base: dict[str, Any] = {"aws:PrincipalAccount": account}
    arn = f"arn:aws:ec2:{region}:{account}"
    if service == "ec2" and operation == "RunInstances":
        inst = {
            **base,
            "aws:RequestTag/gpucloud-run": _tags(params, "instance").get("gpucloud-run"),
            "ec2:MetadataHttpTokens": (params.get("MetadataOptions") or {}).get("HttpTokens", "optional"),
        }
        reqs = [
            Request("ec2:RunInstances", f"{arn}:instance/*", inst),
            Request("ec2:RunInstances", f"arn:aws:ec2:{region}::image/{params.get('ImageId', 'ami-0')}", base),
        ]
        ebs = [m["Ebs"] for m in params.get("BlockDeviceMappings", []) if "Ebs" in m] or [{}]
        vol_tag = _tags(params, "volume").get("gpucloud-run")
        reqs += [
            Request(
                "ec2:RunInstances",
                f"{arn}:volume/*",
                {
                    **base,
                    "aws:RequestTag/gpucloud-run": vol_tag,
                    "ec2:Encrypted": str(bool(e.get("Encrypted"))).lower(),
                },
            )
            for e in ebs
        ]
        reqs += [
            Request("ec2:RunInstances", f"{arn}:security-group/{g}", base) for g in params.get("SecurityGroupIds", [])
        ]
        if params.get("KeyName"):
            reqs.append(Request("ec2:RunInstances", f"{arn}:key-pair/{params['KeyName']}", base))
        return reqs
    if service == "ec2" and operation == "AuthorizeSecurityGroupIngress":
        group = {**base, **{f"aws:ResourceTag/{k}": v for k, v in params.get("_group_tags", {}).items()}}
        rule = {**base, "aws:RequestTag/gpucloud-run": _tags(params, "security-group-rule").get("gpucloud-run")}
        return [
            Request("ec2:AuthorizeSecurityGroupIngress", f"{arn}:security-group/{params['GroupId']}", group),
            Request("ec2:AuthorizeSecurityGroupIngress", f"{arn}:security-group-rule/*", rule),
        ]
    if service == "iam" and operation == "CreateServiceLinkedRole":
        role = f"arn:aws:iam::{account}:role/aws-service-role/{params['_role']}"
        return [Request("iam:CreateServiceLinkedRole", role, {**base, "iam:AWSServiceName": params["AWSServiceName"]})]
    if service == "scheduler":
        sched = (
            f"arn:aws:scheduler:{region}:{account}:schedule/{params.get('GroupName', 'default')}/{params.get('Name')}"
        )
        if operation == "ListSchedules":
            return [Request("scheduler:ListSchedules", "*", base)]
        reqs = [Request(f"scheduler:{operation}", sched, base)]
        if operation == "CreateSchedule":
            reqs.append(
                Request(
                    "iam:PassRole",
                    params["Target"]["RoleArn"],
                    {**base, "iam:PassedToService": "scheduler.amazonaws.com"},
                )
            )
        return reqs
    if service == "s3" and "Bucket" in params:
        owner = params.pop("_owner", account) if "_owner" in params else account
        ctx = {**base, "aws:ResourceAccount": owner}
        action = iam_action(service, operation)
        if "Key" in params:
            return [Request(action, f"arn:aws:s3:::{params['Bucket']}/{params['Key']}", ctx)]
        return [Request(action, f"arn:aws:s3:::{params['Bucket']}", ctx)]
    return []


GOOD_LAUNCH = {
    "ImageId": "ami-0123456789abcdef0",
    "SecurityGroupIds": ["sg-1"],
    "KeyName": "gpucloud-r1",
    "MetadataOptions": {"HttpTokens": "required"},
    "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 100, "Encrypted": True}}],
    "TagSpecifications": [
        {"ResourceType": k, "Tags": [{"Key": "gpucloud-run", "Value": "r1"}]} for k in ("instance", "volume")
    ],
}
BUCKET = f"gpucloud-{ACCOUNT}-{REGION}"
GOOD_RULE = {
    "GroupId": "sg-1",
    "_group_tags": {"gpucloud-run": "r1"},
    "TagSpecifications": [{"ResourceType": "security-group-rule", "Tags": [{"Key": "gpucloud-run", "Value": "r1"}]}],
}
SPOT_ROLE = {"AWSServiceName": "spot.amazonaws.com", "_role": "spot.amazonaws.com/AWSServiceRoleForEC2Spot"}
GOOD_SCHEDULE = {
    "Name": "gpucloud-r1-0",
    "GroupName": "default",
    "Target": {"RoleArn": f"arn:aws:iam::{ACCOUNT}:role/gpucloud-deadline"},
}


def test_the_calls_gpucloud_makes_are_allowed() -> None:
    doc = policy_document()
    assert allowed(doc, requests_of("ec2", "RunInstances", GOOD_LAUNCH))
    assert allowed(doc, requests_of("s3", "CreateBucket", {"Bucket": BUCKET}))
    assert allowed(doc, requests_of("s3", "PutObject", {"Bucket": BUCKET, "Key": "runs/r1/code.tar.gz"}))
    assert allowed(doc, requests_of("scheduler", "CreateSchedule", GOOD_SCHEDULE))
    assert allowed(doc, requests_of("scheduler", "DeleteSchedule", GOOD_SCHEDULE))
    assert allowed(doc, requests_of("ec2", "AuthorizeSecurityGroupIngress", GOOD_RULE))  # ssh / multi-node
    assert allowed(doc, requests_of("iam", "CreateServiceLinkedRole", SPOT_ROLE))  # first spot launch
    assert decide(doc, Request("ec2:DescribeRegions", "*")) == "Allow"  # gpucloud check
    quota = f"arn:aws:servicequotas:{REGION}:{ACCOUNT}:ec2/L-417A185B"
    assert decide(doc, Request("servicequotas:GetServiceQuota", quota, {"aws:PrincipalAccount": ACCOUNT})) == "Allow"
    assert (
        decide(
            doc,
            Request(
                "ec2:TerminateInstances",
                f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-1",
                {"aws:ResourceTag/gpucloud-run": "r1"},
            ),
        )
        == "Allow"
    )


@pytest.mark.parametrize(
    ("case", "service", "operation", "params"),
    [
        (
            "RunInstances without IMDSv2",
            "ec2",
            "RunInstances",
            {**GOOD_LAUNCH, "MetadataOptions": {"HttpTokens": "optional"}},
        ),
        (
            "RunInstances, IMDS left default",
            "ec2",
            "RunInstances",
            {k: v for k, v in GOOD_LAUNCH.items() if k != "MetadataOptions"},
        ),
        (
            "RunInstances, unencrypted volume",
            "ec2",
            "RunInstances",
            {**GOOD_LAUNCH, "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {"Encrypted": False}}]},
        ),
        ("RunInstances without the tag", "ec2", "RunInstances", {**GOOD_LAUNCH, "TagSpecifications": []}),
        (
            "S3 on another account's gpucloud bucket",
            "s3",
            "GetObject",
            {"Bucket": f"gpucloud-999999999999-{REGION}", "Key": "runs/x/code.tar.gz"},
        ),
        (
            "S3 bucket of our name owned by another account",
            "s3",
            "PutObject",
            {"Bucket": BUCKET, "Key": "runs/x/status.json", "_owner": "999999999999"},
        ),
        ("S3 outside runs/", "s3", "GetObject", {"Bucket": BUCKET, "Key": "secrets/x"}),
        ("S3 on a bucket not gpucloud's", "s3", "ListBucket", {"Bucket": "company-data"}),
        (
            "an ingress rule on a group not gpucloud's",
            "ec2",
            "AuthorizeSecurityGroupIngress",
            {**GOOD_RULE, "_group_tags": {}},
        ),
        (
            "an ingress rule without the run tag",
            "ec2",
            "AuthorizeSecurityGroupIngress",
            {**GOOD_RULE, "TagSpecifications": []},
        ),
        (
            "a service-linked role for another service",
            "iam",
            "CreateServiceLinkedRole",
            {"AWSServiceName": "ecs.amazonaws.com", "_role": "ecs.amazonaws.com/AWSServiceRoleForECS"},
        ),
        (
            "the Spot role's path with another service name",
            "iam",
            "CreateServiceLinkedRole",
            {**SPOT_ROLE, "AWSServiceName": "ecs.amazonaws.com"},
        ),
        ("a schedule not gpucloud's", "scheduler", "DeleteSchedule", {**GOOD_SCHEDULE, "Name": "nightly-backup"}),
        ("a schedule in another group", "scheduler", "CreateSchedule", {**GOOD_SCHEDULE, "GroupName": "ops"}),
        (
            "a schedule passing another role",
            "scheduler",
            "CreateSchedule",
            {**GOOD_SCHEDULE, "Target": {"RoleArn": f"arn:aws:iam::{ACCOUNT}:role/admin"}},
        ),
    ],
)
def test_calls_outside_the_policy_are_denied(case: str, service: str, operation: str, params: dict[str, Any]) -> None:
    doc = policy_document()
    reqs = requests_of(service, operation, dict(params))
    assert reqs and not allowed(doc, reqs), case


def test_untagged_destroy_and_wildcard_actions_are_denied() -> None:
    doc = policy_document()
    assert (
        decide(doc, Request("ec2:TerminateInstances", f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-1")) == "ImplicitDeny"
    )
    assert decide(doc, Request("iam:PassRole", "*")) == "ImplicitDeny"
    deadline_role = f"arn:aws:iam::{ACCOUNT}:role/gpucloud-deadline"
    assert (
        decide(
            doc,
            Request(
                "iam:PassRole",
                deadline_role,
                {"aws:PrincipalAccount": ACCOUNT, "iam:PassedToService": "ec2.amazonaws.com"},
            ),
        )
        == "ImplicitDeny"
    )
    assert (
        decide(doc, Request("ec2:AuthorizeSecurityGroupIngress", f"arn:aws:ec2:{REGION}:{ACCOUNT}:security-group/sg-9"))
        == "ImplicitDeny"
    )


def test_evaluator_semantics() -> None:
    """The evaluator itself: explicit deny wins, wildcards, ForAnyValue, Null, NumericEquals."""
    doc = {
        "Statement": [
            {"Effect": "Allow", "Action": "s3:Get*", "Resource": "arn:aws:s3:::b/*"},
            {"Effect": "Deny", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/secret*"},
            {
                "Effect": "Allow",
                "Action": "ec2:CreateTags",
                "Resource": "*",
                "Condition": {"ForAnyValue:StringLike": {"aws:TagKeys": ["gpucloud-*"]}, "NumericEquals": {"n": "2"}},
            },
            {
                "Effect": "Allow",
                "Action": "ec2:DeleteVolume",
                "Resource": "*",
                "Condition": {"Null": {"aws:ResourceTag/t": "true"}},
            },
        ]
    }
    assert decide(doc, Request("s3:GetObjectTagging", "arn:aws:s3:::b/x")) == "Allow"
    assert decide(doc, Request("S3:getobject", "arn:aws:s3:::b/x")) == "Allow"  # actions ignore case
    assert decide(doc, Request("s3:GetObject", "arn:aws:s3:::b/secret.txt")) == "Deny"
    assert decide(doc, Request("ec2:CreateTags", "x", {"aws:TagKeys": ["a", "gpucloud-run"], "n": 2})) == "Allow"
    assert decide(doc, Request("ec2:CreateTags", "x", {"aws:TagKeys": ["a"], "n": 2})) == "ImplicitDeny"
    assert decide(doc, Request("ec2:CreateTags", "x", {"aws:TagKeys": ["gpucloud-run"], "n": 3})) == "ImplicitDeny"
    assert decide(doc, Request("ec2:DeleteVolume", "x")) == "Allow"
    assert decide(doc, Request("ec2:DeleteVolume", "x", {"aws:ResourceTag/t": "v"})) == "ImplicitDeny"


def test_the_deadline_role_may_only_terminate_gpucloud_instances() -> None:
    """`gpucloud iam-policy aws --deadline-role`: what EventBridge Scheduler may do with the role."""
    from gpucloud.providers.aws.policy import deadline_role_documents

    docs = json.loads(json.dumps(deadline_role_documents(ACCOUNT)))  # plain JSON
    perm, trust = docs["PermissionPolicy"], docs["TrustPolicy"]
    inst = f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-1"
    assert decide(perm, Request("ec2:TerminateInstances", inst, {"aws:ResourceTag/gpucloud-run": "r1"})) == "Allow"
    assert decide(perm, Request("ec2:TerminateInstances", inst)) == "ImplicitDeny"
    assert (
        decide(
            perm,
            Request(
                "ec2:TerminateInstances",
                f"arn:aws:ec2:{REGION}:999999999999:instance/i-1",
                {"aws:ResourceTag/gpucloud-run": "r1"},
            ),
        )
        == "ImplicitDeny"
    )
    assert decide(perm, Request("ec2:StopInstances", inst, {"aws:ResourceTag/gpucloud-run": "r1"})) == "ImplicitDeny"
    assert [s["Principal"] for s in trust["Statement"]] == [{"Service": "scheduler.amazonaws.com"}]
    assert decide(trust, Request("sts:AssumeRole", "*", {"aws:SourceAccount": ACCOUNT})) == "Allow"
    assert decide(trust, Request("sts:AssumeRole", "*", {"aws:SourceAccount": "999999999999"})) == "ImplicitDeny"
