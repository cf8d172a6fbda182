"""Container images in Amazon ECR (docs/CONTAINERS.md, "Private registries"): the caller checks that
the image exists before anything is launched and gets a short-lived pull token for the machine
(GetAuthorizationToken: valid 12 hours, it carries the caller's own ECR permissions), which rides
sealed to the node's key like a secret. The machine needs no IAM role and no AWS credentials.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpucloud.errors import UserError
from gpucloud.providers.aws.session import retrying_call, shared_client, shared_session

# <account>.dkr.ecr[-fips].<region>.amazonaws.com[.cn]: ECR's private registry host names.
_HOST = re.compile(r"^(?P<account>[0-9]{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$")
TOKEN_USERNAME = "AWS"


@dataclass(frozen=True)
class EcrImage:
    account: str
    region: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def arn(self) -> str:
        return f"arn:aws:ecr:{self.region}:{self.account}:repository/{self.repository}"


def ecr_image(registry: str, repository: str, tag: str | None, digest: str | None) -> EcrImage | None:
    """The image's ECR coordinates when its registry is an ECR private registry, else None."""
    m = _HOST.match(registry)
    if m is None:
        return None
    return EcrImage(m["account"], m["region"], repository, tag, digest)


def _client(region: str) -> Any:
    return shared_client(shared_session(), "ecr", region)


def check_image(image: EcrImage, where: str) -> None:
    """UserError naming the repository or tag when ECR does not have the image (or the caller may not
    see it): found here, before a machine is paid for, not when the machine's pull fails."""
    from botocore.exceptions import ClientError

    ident = {"imageDigest": image.digest} if image.digest else {"imageTag": image.tag or "latest"}
    try:
        retrying_call(
            _client(image.region),
            "describe_images",
            attempts=3,
            base_s=0.5,
            cap_s=4.0,
            registryId=image.account,
            repositoryName=image.repository,
            imageIds=[ident],
        )
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code == "RepositoryNotFoundException":
            raise UserError(
                f"{where}: ECR repository '{image.repository}' does not exist in account {image.account}, "
                f"region {image.region} (or these credentials cannot see it).",
                hint="Check the image name, or create the repository and push the image first.",
            ) from None
        if code == "ImageNotFoundException":
            raise UserError(
                f"{where}: ECR repository '{image.repository}' has no image {next(iter(ident.values()))}.",
                hint="Push that tag first, or name a tag the repository has (aws ecr list-images).",
            ) from None
        raise UserError(
            f"{where}: cannot look up the image in ECR ({code or exc}).",
            hint="The caller's AWS credentials need ecr:DescribeImages on the repository "
            "(gpucloud iam-policy aws --data JOB prints what the job needs).",
        ) from None


def pull_token(image: EcrImage) -> tuple[str, str, float | None]:
    """(username, password, expires-at epoch) for `<engine> login` to the image's registry."""
    from botocore.exceptions import ClientError

    try:
        out = retrying_call(
            _client(image.region),
            "get_authorization_token",
            attempts=3,
            base_s=0.5,
            cap_s=4.0,
            registryIds=[image.account],
        )
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        raise UserError(
            f"container: cannot get an ECR pull token for account {image.account} ({code or exc}).",
            hint="The caller's AWS credentials need ecr:GetAuthorizationToken.",
        ) from None
    data = (out.get("authorizationData") or [{}])[0]
    user, _, password = base64.b64decode(data.get("authorizationToken", "")).decode().partition(":")
    expires = data.get("expiresAt")
    return user or TOKEN_USERNAME, password, expires.timestamp() if isinstance(expires, datetime) else None


def policy_statements(images: list[EcrImage]) -> list[dict[str, Any]]:
    """What the caller needs to check and pull these images: the token call has no resource-level
    permission; the reads are limited to the named repositories. The token carries these rights to
    the machine, nothing more."""
    if not images:
        return []
    arns = sorted({i.arn for i in images})
    return [
        {"Sid": "EcrPullToken", "Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"},
        {
            "Sid": "EcrPullJobImages",
            "Effect": "Allow",
            "Action": [
                "ecr:BatchCheckLayerAvailability",
                "ecr:BatchGetImage",
                "ecr:DescribeImages",
                "ecr:GetDownloadUrlForLayer",
            ],
            "Resource": arns,
        },
    ]
