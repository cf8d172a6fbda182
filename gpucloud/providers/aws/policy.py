"""The least-privilege IAM policy gpucloud needs on AWS (`gpucloud iam-policy aws`).

Pure data (no boto3; only `--deadline-role` without `--account` asks STS for the account), so
printing it is instant. Why it is shaped this way:
- creating is allowed only with the `gpucloud-run` tag in the request, and destroying only on
  resources that carry it, so these credentials cannot terminate machines gpucloud did not start;
- tags can be written only as part of a create call (ec2:CreateAction), never retagged later;
- the VM's own role (identity.py, one per attempt, path `/gpucloud/<region>/`) is created only
  with the run tag, managed only under that path, and passed only to ec2.amazonaws.com; the other
  iam:PassRole is for the deadline schedule (deadline.py): EventBridge Scheduler assumes the role
  `gpucloud-deadline` to call TerminateInstances after a run's expiry, so PassRole is allowed
  for that role only and only towards scheduler.amazonaws.com (`iam:PassedToService`); the
  schedules themselves are limited to `schedule/default/gpucloud-*` of the caller's account
  (ListSchedules has no resource level);
- that role (`gpucloud iam-policy aws --deadline-role`, `deadline_role_documents`) trusts only
  scheduler.amazonaws.com acting for this account (`aws:SourceAccount`) and may only terminate
  instances carrying the run tag;
- S3 access is limited to gpucloud's own buckets, `gpucloud-<account>-<region>` of the caller's
  account (the ARN through the `${aws:PrincipalAccount}` policy variable, and `aws:ResourceAccount`
  so that a bucket of that name in another account is out of reach), and their `runs/` objects;
- RunInstances may only start instances that require IMDSv2 (`ec2:MetadataHttpTokens`) with
  encrypted volumes (`ec2:Encrypted`).
- Elastic IPs (EFA nodes, which AWS gives no public address) are allocated only with the run tag,
  associated only between a tagged address and a tagged interface, released only when tagged;
- an ingress (or egress) rule is allowed on a gpucloud-tagged group (resource tag) and the new rule must carry
  the run tag in the request (a `security-group-rule` supports request tags only);
- `gpucloud check` reads the regions and the GPU vCPU quotas; a fresh account's first spot launch
  creates AWS's Spot service-linked role, so iam:CreateServiceLinkedRole is allowed for that one
  role and only with `iam:AWSServiceName` = spot.amazonaws.com.
Not expressible in IAM: the port of an ingress rule (EC2 documents no condition key for it); the
rules stay limited to gpucloud-tagged groups and the code adds only port 22 and the run's own group.
parliament (the linter that ships the AWS Service Authorization Reference) checks every document
printed here in the test suite (tests/providers/aws/test_iam_lint.py).
A test records every API operation of the end-to-end runs and checks each one against this, with
a small evaluator that also proves calls outside it are denied (tests/providers/aws/test_aws_policy.py).
"""

from __future__ import annotations

import re
from typing import Any

from gpucloud.contract.provider import KIND_TAG, KIND_VALUE
from gpucloud.contract.provider import TAG_RUN as TAG

BUCKETS = "arn:aws:s3:::gpucloud-${aws:PrincipalAccount}-*"
SCHEDULES = "arn:aws:scheduler:*:${aws:PrincipalAccount}:schedule/default/gpucloud-*"
# IAM ARNs name no account: a role can only be passed, and a service-linked role only created, in
# the caller's own account.
DEADLINE_ROLE = "arn:aws:iam::*:role/gpucloud-deadline"
RUNNER_POLICIES = "arn:aws:iam::*:policy/gpucloud-runner-*"  # `gpucloud setup aws`'s managed policies
SCHEDULER_SERVICE = "scheduler.amazonaws.com"
SPOT_SERVICE = "spot.amazonaws.com"
SPOT_ROLE = "arn:aws:iam::*:role/aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot"

_EC2 = "arn:aws:ec2:*:*"


def policy_document() -> dict[str, Any]:
    """The IAM policy document (version 2012-10-17) as a dict."""
    return {
        "Version": "2012-10-17",
        "Statement": _create_statements()
        + _image_statements()
        + _tagged_resource_statements()
        + _lookup_and_storage_statements()
        + _account_statements()
        + _deadline_statements()
        + _node_role_statements(),
    }


NODE_ROLES = "arn:aws:iam::*:role/gpucloud/*"  # identity.py: path /gpucloud/<region>/, one per attempt
NODE_PROFILES = "arn:aws:iam::*:instance-profile/gpucloud/*"
EC2_SERVICE = "ec2.amazonaws.com"


def _node_role_statements() -> list[dict[str, Any]]:
    """Each run's own node role and instance profile (identity.py): created only with the run tag,
    managed and deleted only under the `/gpucloud/` path, passed only to EC2; gc lists them."""
    return [
        {
            "Sid": "CreateOnlyTaggedNodeRoles",
            "Effect": "Allow",
            "Action": ["iam:CreateRole", "iam:TagRole", "iam:CreateInstanceProfile", "iam:TagInstanceProfile"],
            "Resource": [NODE_ROLES, NODE_PROFILES],
            "Condition": {"Null": {f"aws:RequestTag/{TAG}": "false"}},
        },
        {
            "Sid": "ManageOnlyNodeRoles",
            "Effect": "Allow",
            "Action": [
                "iam:PutRolePolicy",
                "iam:DeleteRolePolicy",
                "iam:DeleteRole",
                "iam:ListRoleTags",
                "iam:AddRoleToInstanceProfile",
                "iam:RemoveRoleFromInstanceProfile",
                "iam:DeleteInstanceProfile",
            ],
            "Resource": [NODE_ROLES, NODE_PROFILES],
        },
        {
            "Sid": "PassOnlyNodeRolesToEc2",
            "Effect": "Allow",
            "Action": "iam:PassRole",
            "Resource": NODE_ROLES,
            "Condition": {"StringEquals": {"iam:PassedToService": EC2_SERVICE}},
        },
        {
            "Sid": "FindNodeRoles",  # gc; ListRoles has no resource-level permission
            "Effect": "Allow",
            "Action": "iam:ListRoles",
            "Resource": "*",
        },
    ]


def _deadline_statements() -> list[dict[str, Any]]:
    """The cloud-side deadline layer: gpucloud's own one-time schedules, and handing the
    scheduler its execution role."""
    return [
        {
            "Sid": "DeadlineSchedules",
            "Effect": "Allow",
            "Action": ["scheduler:CreateSchedule", "scheduler:DeleteSchedule", "scheduler:GetSchedule"],
            "Resource": SCHEDULES,
        },
        {
            "Sid": "FindDeadlineSchedules",  # no resource-level permission for ListSchedules
            "Effect": "Allow",
            "Action": "scheduler:ListSchedules",
            "Resource": "*",
        },
        {
            "Sid": "PassOnlyTheDeadlineRoleToTheScheduler",
            "Effect": "Allow",
            "Action": "iam:PassRole",
            "Resource": DEADLINE_ROLE,
            "Condition": {"StringEquals": {"iam:PassedToService": SCHEDULER_SERVICE}},
        },
    ]


def deadline_role_documents(account: str) -> dict[str, Any]:
    """The execution role of the deadline schedules: its name, trust policy (the scheduler, for
    this account only) and permission policy (terminate gpucloud-tagged instances, nothing else)."""
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": SCHEDULER_SERVICE},
                "Action": "sts:AssumeRole",
                "Condition": {"StringEquals": {"aws:SourceAccount": account}},
            }
        ],
    }
    permissions = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "TerminateOnlyGpucloudInstances",
                "Effect": "Allow",
                "Action": "ec2:TerminateInstances",
                "Resource": f"arn:aws:ec2:*:{account}:instance/*",
                "Condition": {"Null": {f"aws:ResourceTag/{TAG}": "false"}},
            }
        ],
    }
    return {"RoleName": DEADLINE_ROLE.rsplit("/", 1)[-1], "TrustPolicy": trust, "PermissionPolicy": permissions}


def _create_statements() -> list[dict[str, Any]]:
    """Read what is needed to plan, and create only what carries the run tag."""
    has_request_tag = {"Null": {f"aws:RequestTag/{TAG}": "false"}}
    return [
        _describe_statement(),
        *_launch_statements(has_request_tag),
        *_group_and_key_statements(has_request_tag),
        _tag_on_create_statement(),
    ]


def _describe_statement() -> dict[str, Any]:
    """Reads: planning, launching and cleaning up all need to look before they act."""
    return {
        "Sid": "DescribeToPlanLaunchAndClean",
        "Effect": "Allow",
        "Action": [
            "ec2:DescribeAddresses",
            "ec2:DescribeImages",
            "ec2:DescribeInstances",
            "ec2:DescribeInstanceTypes",
            "ec2:DescribeInstanceTypeOfferings",
            "ec2:DescribeKeyPairs",
            "ec2:DescribePlacementGroups",
            "ec2:DescribeSecurityGroups",
            "ec2:DescribeSubnets",
            "ec2:DescribeVolumes",
            "ec2:DescribeVpcs",
        ],
        "Resource": "*",
    }


def _launch_statements(has_request_tag: dict[str, Any]) -> list[dict[str, Any]]:
    """RunInstances: only tagged instances with IMDSv2 and encrypted volumes, from any image,
    subnet, group, key and placement group."""
    return [
        {
            "Sid": "LaunchOnlyTaggedInstancesWithImdsV2",
            "Effect": "Allow",
            "Action": "ec2:RunInstances",
            "Resource": f"{_EC2}:instance/*",
            "Condition": {**has_request_tag, "StringEquals": {"ec2:MetadataHttpTokens": "required"}},
        },
        {
            "Sid": "LaunchOnlyTaggedEncryptedVolumes",
            "Effect": "Allow",
            "Action": "ec2:RunInstances",
            "Resource": f"{_EC2}:volume/*",
            "Condition": {**has_request_tag, "Bool": {"ec2:Encrypted": "true"}},
        },
        {
            "Sid": "LaunchWithImageNetworkAndKey",
            "Effect": "Allow",
            "Action": "ec2:RunInstances",
            "Resource": [
                "arn:aws:ec2:*::image/*",
                f"{_EC2}:subnet/*",
                f"{_EC2}:network-interface/*",
                f"{_EC2}:security-group/*",
                f"{_EC2}:key-pair/*",
                f"{_EC2}:placement-group/*",
            ],
        },
    ]


def _group_and_key_statements(has_request_tag: dict[str, Any]) -> list[dict[str, Any]]:
    """Security groups, key pairs and placement groups: created only with the run tag."""
    return [
        {
            "Sid": "CreateOnlyTaggedGroupsAndKeys",
            "Effect": "Allow",
            "Action": ["ec2:CreateSecurityGroup", "ec2:CreateKeyPair", "ec2:CreatePlacementGroup"],
            "Resource": [f"{_EC2}:security-group/*", f"{_EC2}:key-pair/*", f"{_EC2}:placement-group/*"],
            "Condition": has_request_tag,
        },
        {
            "Sid": "CreateGroupsInVpcs",
            "Effect": "Allow",
            "Action": "ec2:CreateSecurityGroup",
            "Resource": f"{_EC2}:vpc/*",
        },
        {
            # EFA: a node with several interfaces gets no public address from AWS (efa.py).
            "Sid": "AllocateOnlyTaggedElasticIps",
            "Effect": "Allow",
            "Action": "ec2:AllocateAddress",
            "Resource": f"{_EC2}:elastic-ip/*",
            "Condition": has_request_tag,
        },
        {
            "Sid": "AssociateOwnElasticIpsWithOwnInterfaces",
            "Effect": "Allow",
            "Action": "ec2:AssociateAddress",
            "Resource": [f"{_EC2}:elastic-ip/*", f"{_EC2}:network-interface/*"],
            "Condition": {"Null": {f"aws:ResourceTag/{TAG}": "false"}},
        },
    ]


def _tag_on_create_statement() -> dict[str, Any]:
    """CreateTags only as part of a create call, so an existing resource cannot be tagged as ours."""
    return {
        "Sid": "TagOnlyWhileCreating",
        "Effect": "Allow",
        "Action": "ec2:CreateTags",
        "Resource": [
            f"{_EC2}:instance/*",
            f"{_EC2}:volume/*",
            f"{_EC2}:security-group/*",
            f"{_EC2}:security-group-rule/*",
            f"{_EC2}:key-pair/*",
            f"{_EC2}:placement-group/*",
            f"{_EC2}:elastic-ip/*",
            f"{_EC2}:network-interface/*",
            "arn:aws:ec2:*::image/*",
            "arn:aws:ec2:*::snapshot/*",
        ],
        "Condition": {
            "StringEquals": {
                "ec2:CreateAction": [
                    "RunInstances",
                    "CreateSecurityGroup",
                    "CreateKeyPair",
                    "AuthorizeSecurityGroupIngress",
                    "AuthorizeSecurityGroupEgress",
                    "CreatePlacementGroup",
                    "AllocateAddress",
                    "CreateImage",
                ]
            }
        },
    }


def _image_statements() -> list[dict[str, Any]]:
    """`gpucloud image build/rm`: snapshot only gpucloud's own builders, into images tagged as
    gpucloud images; deregister and delete only those."""
    kind = {f"aws:RequestTag/{KIND_TAG}": KIND_VALUE}
    return [
        {
            "Sid": "BakeOnlyOwnBuilders",
            "Effect": "Allow",
            "Action": "ec2:CreateImage",
            "Resource": f"{_EC2}:instance/*",
            "Condition": {"Null": {f"aws:ResourceTag/{TAG}": "false"}},
        },
        {
            "Sid": "BakeOnlyTaggedImages",
            "Effect": "Allow",
            "Action": "ec2:CreateImage",
            "Resource": ["arn:aws:ec2:*::image/*", "arn:aws:ec2:*::snapshot/*"],
            "Condition": {"StringEquals": kind},
        },
        {
            "Sid": "DeleteOnlyBakedImages",
            "Effect": "Allow",
            "Action": ["ec2:DeregisterImage", "ec2:DeleteSnapshot"],
            "Resource": ["arn:aws:ec2:*::image/*", "arn:aws:ec2:*::snapshot/*"],
            "Condition": {"StringEquals": {f"aws:ResourceTag/{KIND_TAG}": KIND_VALUE}},
        },
    ]


def _tagged_resource_statements() -> list[dict[str, Any]]:
    """Change and destroy only what gpucloud tagged."""
    has_resource_tag = {"Null": {f"aws:ResourceTag/{TAG}": "false"}}
    return [
        {
            # ssh: port 22 from the caller; multi-node: the group to itself (the run's own nodes),
            # in and out (EFA asks for both).
            "Sid": "IngressRulesOnOwnGroups",
            "Effect": "Allow",
            "Action": ["ec2:AuthorizeSecurityGroupIngress", "ec2:AuthorizeSecurityGroupEgress"],
            "Resource": f"{_EC2}:security-group/*",
            "Condition": has_resource_tag,
        },
        {
            # The new rule itself exists only once the call succeeds: it has request tags, no resource tags.
            "Sid": "IngressRulesCarryTheRunTag",
            "Effect": "Allow",
            "Action": ["ec2:AuthorizeSecurityGroupIngress", "ec2:AuthorizeSecurityGroupEgress"],
            "Resource": f"{_EC2}:security-group-rule/*",
            "Condition": {"Null": {f"aws:RequestTag/{TAG}": "false"}},
        },
        {
            "Sid": "DestroyOnlyWhatGpucloudTagged",
            "Effect": "Allow",
            "Action": [
                "ec2:TerminateInstances",
                "ec2:DeleteSecurityGroup",
                "ec2:DeleteKeyPair",
                "ec2:DeletePlacementGroup",
                "ec2:DeleteVolume",
                "ec2:ReleaseAddress",
            ],
            "Resource": [
                f"{_EC2}:instance/*",
                f"{_EC2}:security-group/*",
                f"{_EC2}:key-pair/*",
                f"{_EC2}:placement-group/*",
                f"{_EC2}:volume/*",
                f"{_EC2}:elastic-ip/*",
            ],
            "Condition": has_resource_tag,
        },
    ]


def _lookup_and_storage_statements() -> list[dict[str, Any]]:
    """The Ubuntu image parameter, who the caller is, and the run buckets in the caller's own account."""
    own_account = {"StringEquals": {"aws:ResourceAccount": "${aws:PrincipalAccount}"}}
    return [
        {
            "Sid": "UbuntuImageIds",
            "Effect": "Allow",
            "Action": "ssm:GetParameter",
            "Resource": [
                "arn:aws:ssm:*:*:parameter/aws/service/canonical/ubuntu/*",
                "arn:aws:ssm:*:*:parameter/aws/service/deeplearning/ami/*",
            ],  # GPU images (docs/STACKS.md)
        },
        {
            "Sid": "WhoAmI",
            "Effect": "Allow",
            "Action": "sts:GetCallerIdentity",
            "Resource": "*",
        },
        {
            "Sid": "RunBuckets",
            "Effect": "Allow",
            "Action": [
                "s3:CreateBucket",
                "s3:ListBucket",
                "s3:PutBucketPublicAccessBlock",
                "s3:PutEncryptionConfiguration",
                "s3:PutLifecycleConfiguration",
            ],
            "Resource": BUCKETS,
            "Condition": own_account,
        },
        {
            "Sid": "RunObjects",
            "Effect": "Allow",
            "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
            "Resource": f"{BUCKETS}/runs/*",
            "Condition": own_account,
        },
    ]


def _account_statements() -> list[dict[str, Any]]:
    """`gpucloud check` (regions, GPU quotas), `catalog refresh`, and a fresh account's Spot service-linked role."""
    return [
        {
            "Sid": "CheckRegions",  # `gpucloud check` and catalog refresh; no resource-level permission
            "Effect": "Allow",
            "Action": "ec2:DescribeRegions",
            "Resource": "*",
        },
        {
            # `catalog refresh`: every GPU type, its spot price history and its on-demand price (the
            # Price List API has no resource-level permission; neither do these EC2 reads).
            "Sid": "CatalogRefresh",
            "Effect": "Allow",
            "Action": ["ec2:DescribeInstanceTypes", "ec2:DescribeSpotPriceHistory", "pricing:GetProducts"],
            "Resource": "*",
        },
        {
            "Sid": "CheckGpuQuotas",  # `check` and `run` before a launch: the EC2 vCPU quotas of the GPU families
            "Effect": "Allow",
            "Action": ["servicequotas:GetServiceQuota", "servicequotas:GetAWSDefaultServiceQuota"],
            "Resource": "arn:aws:servicequotas:*:${aws:PrincipalAccount}:ec2/*",
        },
        {
            # A fresh account's first spot RunInstances creates the Spot service-linked role.
            "Sid": "SpotServiceLinkedRole",
            "Effect": "Allow",
            "Action": "iam:CreateServiceLinkedRole",
            "Resource": SPOT_ROLE,
            "Condition": {"StringEquals": {"iam:AWSServiceName": SPOT_SERVICE}},
        },
        {
            # `gpucloud check`: are the pieces `gpucloud setup aws` creates there (read only).
            "Sid": "CheckSetupPieces",
            "Effect": "Allow",
            "Action": ["iam:GetRole", "iam:GetRolePolicy", "iam:GetPolicy", "iam:GetPolicyVersion"],
            "Resource": [DEADLINE_ROLE, RUNNER_POLICIES],
        },
    ]


def role_documents(account: str | None, part: str | None) -> dict[str, Any]:
    """What `gpucloud iam-policy aws --deadline-role [--part trust|permissions]` prints; the
    account comes from STS when not given (the trust policy names it)."""
    from gpucloud.errors import UserError

    parts = {"trust": "TrustPolicy", "permissions": "PermissionPolicy"}
    if part is not None and part not in parts:
        raise UserError(f"--part takes `trust` or `permissions`, not {part!r}.")
    if account is None:
        account = _caller_account()
    if not re.fullmatch(r"\d{12}", account):
        raise UserError(f"--account takes a 12-digit AWS account id, not {account!r}.")
    docs = deadline_role_documents(account)
    return docs[parts[part]] if part else docs


def _caller_account() -> str:
    """The credentials' account (STS GetCallerIdentity), or a UserError that names --account."""
    from gpucloud.errors import UserError
    from gpucloud.providers.aws.session import shared_client, shared_session

    try:
        session = shared_session()
        region = session.region_name or "us-east-1"
        return str(shared_client(session, "sts", region).get_caller_identity()["Account"])
    except Exception as exc:  # noqa: BLE001 - any failure has the same way out
        raise UserError(
            f"could not find the AWS account to name in the role's trust policy "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}).",
            hint="Pass it: `gpucloud iam-policy aws --deadline-role --account 123456789012`.",
        ) from None
