"""AWS's capability services (gpucloud/contract/services.py): S3 buckets as inputs and outputs
(data.py, mount.py) and ECR images' pull tokens (ecr.py), found through the registry."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpucloud.contract.services import DataStore, Files, ImageLogin, Statements
from gpucloud.errors import UserError
from gpucloud.providers.aws import data, ecr, identity, mount
from gpucloud.providers.aws.network import CLOUD
from gpucloud.providers.aws.session import AwsClients


class S3Store(DataStore):
    """s3:// inputs and outputs: presigned URLs, POST policies, federation tokens for mounts."""

    @classmethod
    def mount_limit(cls, max_duration: int, where: str) -> None:
        """S3 credentials for a mount last 36 hours at most: a longer job is refused from its file alone."""
        if max_duration > mount.MAX_TOKEN_S:
            raise UserError(
                f"{where}: mode: mount on S3 gets credentials for at most {mount.MAX_TOKEN_S // 3600} hours "
                f"(STS's limit), and max_duration is {max_duration / 3600:g} hours.",
                hint="Lower max_duration to 36h or less, or use mode: copy for this input.",
            )

    @classmethod
    def grant_life_s(cls, cloud: str) -> int | None:
        """An AWS node signs its S3 requests with its own role; any other node holds SigV4 grants,
        which live 7 days at most (and end sooner with temporary credentials)."""
        return None if cloud == CLOUD else data.MAX_PRESIGN_S

    @classmethod
    def node_mounts(cls, cloud: str) -> bool:
        """Every AWS machine has a role of its own, given the mounted folders (identity.py)."""
        return cloud == CLOUD

    @classmethod
    def policy_statements(
        cls, reads: list[tuple[str, str]], writes: list[tuple[str, str]], mounts: list[tuple[str, str]]
    ) -> Statements:
        return data.policy_statements(reads, writes) + mount.policy_statements(mounts)

    def list_input(self, bucket: str, prefix: str, where: str) -> tuple[str, Files]:
        return data.list_input(bucket, prefix, where)

    def check_output(self, bucket: str, where: str) -> str:
        return data.check_output(bucket, where)

    def check_mount(self, bucket: str, prefix: str, where: str) -> str:
        return mount.check_mount(bucket, prefix, where)

    def check_node_mount(self, bucket: str, prefix: str, where: str) -> str:
        return mount.check_folder(bucket, prefix, where)

    def input_urls(self, bucket: str, region: str, keys: list[str], expires: datetime) -> list[str]:
        return data.input_urls(bucket, region, keys, expires)

    def output_grant(self, bucket: str, region: str, prefix: str, expires: datetime) -> dict[str, Any]:
        return data.output_grant(bucket, region, prefix, expires)

    def mount_grant(
        self, bucket: str, prefix: str, region: str, run_id: str, expires: datetime, where: str
    ) -> dict[str, Any]:
        return mount.mount_grant(bucket, prefix, region, run_id, expires, where)

    def node_mount_grant(self, bucket: str, prefix: str, region: str) -> dict[str, Any]:
        return mount.node_mount(bucket, prefix, region)

    def admit_node(
        self,
        handle: Any,
        reads: list[tuple[str, str]],
        writes: list[tuple[str, str]],
        mounts: list[tuple[str, str]],
    ) -> str:
        """The data policy on the attempt's node role (none on another cloud's machines: nothing to do).
        A refusal (no iam:PutRolePolicy, a policy over IAM's size limit) leaves the CLI's grants alone."""
        from botocore.exceptions import BotoCoreError, ClientError

        names = handle.resources.get(identity.ROLE, []) if handle is not None else []
        statements = data.node_statements(reads, writes, mounts)
        if statements and not names and getattr(handle, "cloud", "") == CLOUD:  # not admitted: no mount as itself
            return (
                "the attempt's machines have no role of their own: the node reaches the job's S3 data "
                "with the launcher's grants only"
            )
        try:
            for name in names if statements else []:
                identity.put_data_policy(AwsClients(), name, statements)
        except (ClientError, BotoCoreError) as exc:
            return (
                f"the node role could not be given the job's S3 prefixes ({exc}): the node reaches them "
                "with the launcher's grants only, which end with the launcher's credentials"
            )
        return ""


class EcrLogin(ImageLogin):
    """An image in an ECR private registry: looked up before launch, a 12-hour pull token."""

    def __init__(self, image: ecr.EcrImage) -> None:
        self.image = image

    def check(self, where: str) -> None:
        ecr.check_image(self.image, where)

    def pull_token(self, where: str) -> tuple[str, str, float | None]:
        return ecr.pull_token(self.image)

    def policy_statements(self) -> Statements:
        return ecr.policy_statements([self.image])


def ecr_login(registry: str, repository: str, tag: str | None, digest: str | None) -> EcrLogin | None:
    """The image's ECR login, or None when its registry is not an ECR private registry."""
    image = ecr.ecr_image(registry, repository, tag, digest)
    return EcrLogin(image) if image else None
