"""The least-privilege IAM policy gpucloud needs on AWS (`gpucloud iam-policy aws`).

Pure data (no boto3), so printing it is instant. Why it is shaped this way:
- creating is allowed only with the `gpucloud-run` tag in the request, and destroying only on
  resources that carry it, so these credentials cannot terminate machines gpucloud did not start;
- tags can be written only as part of a create call (ec2:CreateAction), never retagged later;
- the VM needs no role at all (it talks through presigned URLs), so there is no iam:PassRole;
- S3 access is limited to gpucloud's own buckets, `gpucloud-<account>-<region>` of the caller's
  account (the ARN through the `${aws:PrincipalAccount}` policy variable, and `aws:ResourceAccount`
  so that a bucket of that name in another account is out of reach), and their `runs/` objects;
- RunInstances may only start instances that require IMDSv2 (`ec2:MetadataHttpTokens`) with
  encrypted volumes (`ec2:Encrypted`).
Not expressible in IAM: the port of an ingress rule (EC2 documents no condition key for it); the
rules stay limited to gpucloud-tagged groups and the code adds only port 22 and the run's own group.
A test records every API operation of the end-to-end runs and checks each one against this, with
a small evaluator that also proves calls outside it are denied (tests/test_aws_policy.py).
"""

from __future__ import annotations

from typing import Any

from gpucloud.providers.base import TAG_RUN as TAG

BUCKETS = "arn:aws:s3:::gpucloud-${aws:PrincipalAccount}-*"

_EC2 = "arn:aws:ec2:*:*"


def policy_document() -> dict[str, Any]:
    """The IAM policy document (version 2012-10-17) as a dict."""
    return {"Version": "2012-10-17", "Statement": _create_statements() + _destroy_and_storage_statements()}


def _create_statements() -> list[dict[str, Any]]:
    """Read what is needed to plan, and create only what carries the run tag."""
    has_request_tag = {"Null": {f"aws:RequestTag/{TAG}": "false"}}
    return [
    {
        "Sid": "DescribeToPlanLaunchAndClean",
        "Effect": "Allow",
        "Action": [
            "ec2:DescribeImages",
            "ec2:DescribeInstances",
            "ec2:DescribeInstanceTypeOfferings",
            "ec2:DescribeKeyPairs",
            "ec2:DescribePlacementGroups",
            "ec2:DescribeSecurityGroups",
            "ec2:DescribeSubnets",
            "ec2:DescribeVolumes",
            "ec2:DescribeVpcs",
        ],
        "Resource": "*",
    },
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
        ],
        "Condition": {"StringEquals": {"ec2:CreateAction": [
            "RunInstances", "CreateSecurityGroup", "CreateKeyPair", "AuthorizeSecurityGroupIngress",
            "CreatePlacementGroup",
        ]}},
    },
    ]


def _destroy_and_storage_statements() -> list[dict[str, Any]]:
    """Change and destroy only what gpucloud tagged; the Ubuntu image parameter; the run buckets."""
    has_resource_tag = {"Null": {f"aws:ResourceTag/{TAG}": "false"}}
    own_account = {"StringEquals": {"aws:ResourceAccount": "${aws:PrincipalAccount}"}}
    return [
    {
        # ssh: port 22 from the caller; multi-node: the group to itself (the run's own nodes).
        "Sid": "IngressRulesOnOwnGroups",
        "Effect": "Allow",
        "Action": "ec2:AuthorizeSecurityGroupIngress",
        "Resource": [f"{_EC2}:security-group/*", f"{_EC2}:security-group-rule/*"],
        "Condition": has_resource_tag,
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
        ],
        "Resource": [
            f"{_EC2}:instance/*",
            f"{_EC2}:security-group/*",
            f"{_EC2}:key-pair/*",
            f"{_EC2}:placement-group/*",
            f"{_EC2}:volume/*",
        ],
        "Condition": has_resource_tag,
    },
    {
        "Sid": "UbuntuImageIds",
        "Effect": "Allow",
        "Action": "ssm:GetParameter",
        "Resource": "arn:aws:ssm:*::parameter/aws/service/canonical/ubuntu/*",
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
