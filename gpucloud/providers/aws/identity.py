"""The node's own AWS identity: one IAM role and instance profile per attempt, whose inline policy
admits only this run's channel objects (docs/PROVIDERS.md, "AWS node identity").

Why: a presigned URL dies with the credentials that signed it, and most callers hold short-lived
ones (SSO, an assumed role, CI's OIDC role: one hour by default). With a role of its own the node
signs its S3 requests itself (gpucloud/vm/agent/sigv4.py, from IMDSv2), refreshed by EC2 for the
whole run, whatever happens to the caller's credentials.

Least privilege: read the run's objects (`runs/<run>/*`: code, manifest, sealed secrets, inputs,
peers' ready/done, checkpoints), write only what a node writes (status, log parts and claims,
artifacts, ready, done, checkpoint slots), list only the claim objects of the run's log prefixes.
No other run, no delete, no other bucket. The role's name is a hash of run, region and attempt
(IAM names stop at 64 characters, a run id alone is up to 61); its path `/gpucloud/<region>/` tells
gc, in one listing of `/gpucloud/` (IAM is global), which region's role it is, and it carries the
run's tags like every other resource. The journal row is written before the create calls, so a
crash leaves a name teardown and gc can find.

IAM is eventually consistent: a new instance profile can be refused by RunInstances for some
seconds ("Invalid IAM Instance Profile name"); launch.py retries that one error, bounded.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from gpucloud.providers.aws.errors import error_code
from gpucloud.providers.aws.network import CLOUD, run_tags, tag_list
from gpucloud.providers.aws.session import AwsClients

if TYPE_CHECKING:
    from gpucloud.contract.provider import Journal, LaunchRequest, RunHandle

ROLE = "node-role"  # RunHandle resource kind: the role and its instance profile, one name
POLICY_NAME = "gpucloud-run-objects"
DATA_POLICY_NAME = "gpucloud-run-data"  # the job's named input/output prefixes, added once the grants are made
EC2_TRUST = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}],
}
GONE = ("NoSuchEntity",)


def role_name(run_id: str, region: str, attempt: int) -> str:
    """`gpucloud-node-<40 hex>`: the same for every retry of one attempt, 54 characters."""
    return "gpucloud-node-" + hashlib.sha256(f"{run_id}|{region}|{attempt}".encode()).hexdigest()[:40]


def role_path(region: str) -> str:
    return f"/gpucloud/{region}/"


def node_policy(bucket: str, run_id: str) -> dict[str, Any]:
    """The role's one inline policy: this run's objects in the region's bucket, nothing else."""
    run = f"arn:aws:s3:::{bucket}/runs/{run_id}/"
    writes = ["node-*/status.json", "node-*/log/*", "node-*/artifacts.tar.gz", "node-*/ready", "node-*/done"]
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "ReadThisRun", "Effect": "Allow", "Action": "s3:GetObject", "Resource": run + "*"},
            {
                "Sid": "WriteWhatANodeWrites",
                "Effect": "Allow",
                "Action": "s3:PutObject",
                "Resource": [run + w for w in writes] + [run + "checkpoint/*"],
            },
            {
                "Sid": "ListThisRunsClaims",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": f"arn:aws:s3:::{bucket}",
                "Condition": {"StringLike": {"s3:prefix": f"runs/{run_id}/node-*/log/claim-*"}},
            },
        ],
    }


IAM_REGION = "us-east-1"  # IAM is global: whatever region a client names, it reaches the one service


def _iam(aws: AwsClients) -> Any:
    """The process's one IAM client: a client per region would be the same service, made again."""
    return aws.client("iam", IAM_REGION)


def _tolerate(aws: AwsClients, op: str, codes: tuple[str, ...], **kwargs: Any) -> Any:
    """One IAM call through the retrying call; an error whose code is in `codes` means done."""
    from botocore.exceptions import ClientError

    try:
        return aws.call(_iam(aws), op, **kwargs)
    except ClientError as exc:
        if error_code(exc) in codes:
            return None
        raise


def create_identity(aws: AwsClients, req: LaunchRequest, journal: Journal, handle: RunHandle, bucket: str) -> str:
    """The attempt's role and instance profile (journalled first); returns the profile's name."""
    name = role_name(req.run_id, req.region, req.attempt)
    tags = tag_list(run_tags(req, name))
    res = journal.intent(req.run_id, ROLE, name, req.region, CLOUD)
    handle.resources.setdefault(ROLE, []).append(name)
    path = role_path(req.region)
    _tolerate(
        aws,
        "create_role",
        ("EntityAlreadyExists",),  # a retried attempt: the same name, made by this run
        RoleName=name,
        Path=path,
        AssumeRolePolicyDocument=json.dumps(EC2_TRUST),
        Description=f"gpucloud run {req.run_id}: its own objects only",
        MaxSessionDuration=3600,
        Tags=tags,
    )
    aws.call(
        _iam(aws),
        "put_role_policy",
        RoleName=name,
        PolicyName=POLICY_NAME,
        PolicyDocument=json.dumps(node_policy(bucket, req.run_id)),
    )
    _tolerate(
        aws,
        "create_instance_profile",
        ("EntityAlreadyExists",),
        InstanceProfileName=name,
        Path=path,
        Tags=tags,
    )
    _tolerate(aws, "add_role_to_instance_profile", ("LimitExceeded",), InstanceProfileName=name, RoleName=name)
    journal.created(res, name)
    return name


def put_data_policy(aws: AwsClients, name: str, statements: list[dict[str, Any]]) -> None:
    """The role's second inline policy: the job's S3 data prefixes (data.node_statements), so the
    node's own signature reaches its inputs and outputs after the caller's credentials are gone.
    Put again on every call (the same document: idempotent)."""
    doc = {"Version": "2012-10-17", "Statement": statements}
    aws.call(_iam(aws), "put_role_policy", RoleName=name, PolicyName=DATA_POLICY_NAME, PolicyDocument=json.dumps(doc))


def delete_identity(aws: AwsClients, name: str) -> None:
    """Profile, then policies, then role; what is already gone counts as deleted."""
    _tolerate(aws, "remove_role_from_instance_profile", GONE, InstanceProfileName=name, RoleName=name)
    _tolerate(aws, "delete_instance_profile", GONE, InstanceProfileName=name)
    _tolerate(aws, "delete_role_policy", GONE, RoleName=name, PolicyName=POLICY_NAME)
    _tolerate(aws, "delete_role_policy", GONE, RoleName=name, PolicyName=DATA_POLICY_NAME)
    _tolerate(aws, "delete_role", GONE, RoleName=name)


def node_roles(aws: AwsClients, regions: list[str]) -> dict[str, list[tuple[str, dict[str, str]]]]:
    """(name, tags) of every gpucloud node role, by the region its path names, for gc: one listing
    of the `/gpucloud/` paths (IAM is global), not one per region."""
    found: dict[str, list[tuple[str, dict[str, str]]]] = {region: [] for region in regions}
    by_path = {role_path(region): region for region in regions}
    kwargs: dict[str, Any] = {"PathPrefix": "/gpucloud/"}
    while True:
        page = aws.call(_iam(aws), "list_roles", **kwargs)
        for role in page.get("Roles", []):
            region = by_path.get(str(role.get("Path")))
            if region is None:  # not a node role of a region gc sweeps
                continue
            name = str(role["RoleName"])
            tags = aws.call(_iam(aws), "list_role_tags", RoleName=name).get("Tags", [])
            found[region].append((name, {str(t["Key"]): str(t["Value"]) for t in tags}))
        if not page.get("IsTruncated"):
            return found
        kwargs["Marker"] = page["Marker"]


def is_profile_propagating(exc: Exception) -> bool:
    """RunInstances' answer while a new instance profile is not yet visible to EC2."""
    from botocore.exceptions import ClientError

    if not isinstance(exc, ClientError) or error_code(exc) != "InvalidParameterValue":
        return False
    message = str(exc.response.get("Error", {}).get("Message", ""))
    return "iam instance profile" in message.lower() or "iaminstanceprofile" in message.lower()
