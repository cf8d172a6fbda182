"""Undo `gpucloud setup aws` in the session's moto account (tests that run setup leave none of it)."""

from __future__ import annotations

from gpucloud.providers.aws.setup import DEADLINE_INLINE, runner_names
from tests.support.moto_server import ACCOUNT, Moto


def remove_setup_pieces(moto: Moto) -> None:
    """Delete the deadline role and every runner policy version, if there."""
    iam = moto.client("iam")
    try:
        iam.delete_role_policy(RoleName="gpucloud-deadline", PolicyName=DEADLINE_INLINE)
        iam.delete_role(RoleName="gpucloud-deadline")
    except iam.exceptions.NoSuchEntityException:
        pass
    for name in runner_names():
        arn = f"arn:aws:iam::{ACCOUNT}:policy/{name}"
        try:
            for v in iam.list_policy_versions(PolicyArn=arn)["Versions"]:
                if not v["IsDefaultVersion"]:
                    iam.delete_policy_version(PolicyArn=arn, VersionId=v["VersionId"])
            iam.delete_policy(PolicyArn=arn)
        except iam.exceptions.NoSuchEntityException:
            pass
