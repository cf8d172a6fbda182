"""Baked images on EC2: snapshot a builder instance, list and delete the results.

Three calls, each a thin wrapper over the shared boto3 clients (providers/aws/session.py: bounded
timeouts, AWS_ENDPOINT_URL honoured, so tests point it at moto). The images are tagged
`gpucloud:kind=image`: the reaper and `gc` look for run tags and never touch them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpucloud.contract.provider import HASH_TAG, KIND_TAG, KIND_VALUE, STACK_TAG, BakedImage

# What an EC2 implementation answers when it lacks "snapshot" TagSpecifications on CreateImage
# (AWS has them; moto 5 does not and fails the call with an HTML error page): then the image is
# tagged in the call and its snapshots right after (which the IAM policy does not grant on AWS).
UNSUPPORTED = ("InternalError", "InternalFailure", "NotImplemented", "UnsupportedOperation", "InvalidParameterValue")

IMAGE_WAIT_S = 3600.0  # CreateImage of a 100 GB root volume takes minutes; an hour is a failure
IMAGE_POLL_S = 10.0


def _ec2(region: str) -> Any:
    from gpucloud.providers.aws.session import shared_client, shared_session

    return shared_client(shared_session(), "ec2", region)


@contextmanager
def _access_errors(what: str) -> Iterator[None]:
    """Missing or refused credentials, a dead endpoint and an action the policy lacks become
    CredentialsError / EndpointError / PermissionDenied (access.py), so `image ls/rm` fail with
    exit 78, the refused action and the fix, not as an internal error."""
    from botocore.exceptions import BotoCoreError, ClientError

    from gpucloud.providers.aws.access import classify_access, permission_denied

    try:
        yield
    except (ClientError, BotoCoreError) as exc:
        access = classify_access(exc, what=what) or permission_denied(exc, service="ec2", what=what)
        if access is not None:
            raise access from None
        raise


class AwsImageStore:
    """`ImageStore` for EC2: CreateImage / DescribeImages(Owners=self) / DeregisterImage + snapshots."""

    def create_image(self, region: str, instance_id: str, name: str, tags: dict[str, str]) -> str:
        tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
        ec2 = _ec2(region)
        args = {
            "InstanceId": instance_id,
            "Name": name,
            "Description": tags.get(STACK_TAG, name)[:255],
            "NoReboot": True,
        }  # the builder ran `sync` and waits; keep it as it is
        with _access_errors("creating an image"):
            resp, tag_snapshots = self._create(ec2, args, tag_list)
            ref = str(resp["ImageId"])
            self._wait_available(ec2, ref)
            snapshots = self._snapshots(ec2, ref)
            if tag_snapshots and snapshots:
                ec2.create_tags(Resources=snapshots, Tags=tag_list)
        return ref

    @staticmethod
    def _create(ec2: Any, args: dict[str, Any], tag_list: list[dict[str, str]]) -> tuple[Any, bool]:
        """CreateImage with image and snapshots tagged in the call (the only tagging the IAM policy
        allows); (response, whether the snapshots still need their tags)."""
        from botocore.exceptions import ClientError
        from botocore.parsers import ResponseParserError

        try:
            return ec2.create_image(
                **args, TagSpecifications=[{"ResourceType": kind, "Tags": tag_list} for kind in ("image", "snapshot")]
            ), False
        except (ClientError, ResponseParserError) as exc:  # an EC2 without snapshot TagSpecifications
            if isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") not in UNSUPPORTED:
                raise
        return ec2.create_image(**args, TagSpecifications=[{"ResourceType": "image", "Tags": tag_list}]), True

    @staticmethod
    def _wait_available(ec2: Any, ref: str, timeout: float = IMAGE_WAIT_S, poll: float = IMAGE_POLL_S) -> None:
        """Until the AMI is `available` (its snapshot complete): only then may the builder go."""
        from gpucloud.errors import GpucloudError

        end = time.monotonic() + timeout
        while True:
            images = ec2.describe_images(ImageIds=[ref]).get("Images", [])
            state = images[0].get("State", "pending") if images else "pending"
            if state == "available":
                return
            if state in ("failed", "invalid", "deregistered", "error") or time.monotonic() > end:
                raise GpucloudError(
                    f"image {ref} did not become available (state {state}).",
                    hint=f"`gpucloud image rm {ref} --cloud aws --region ...` removes what is left.",
                )
            time.sleep(poll)

    @staticmethod
    def _snapshots(ec2: Any, ref: str) -> list[str]:
        images = ec2.describe_images(ImageIds=[ref]).get("Images", [])
        return [
            m["Ebs"]["SnapshotId"]
            for i in images
            for m in i.get("BlockDeviceMappings", [])
            if m.get("Ebs", {}).get("SnapshotId")
        ]

    def list_images(self, region: str) -> list[BakedImage]:
        with _access_errors("listing images"):
            resp = _ec2(region).describe_images(
                Owners=["self"], Filters=[{"Name": f"tag:{KIND_TAG}", "Values": [KIND_VALUE]}]
            )
        out = []
        for image in resp.get("Images", []):
            tags = {t["Key"]: t["Value"] for t in image.get("Tags", [])}
            out.append(
                BakedImage(
                    ref=image["ImageId"],
                    region=region,
                    name=image.get("Name", ""),
                    stack_hash=tags.get(HASH_TAG, ""),
                    tags=tags,
                    created=str(image.get("CreationDate", "")),
                )
            )
        return out

    def delete_image(self, region: str, ref: str) -> None:
        ec2 = _ec2(region)
        with _access_errors("deleting an image"):
            snapshots = self._snapshots(ec2, ref)
            ec2.deregister_image(ImageId=ref)
            for snap in snapshots:  # a deregistered AMI leaves its snapshots (and their bill) behind
                ec2.delete_snapshot(SnapshotId=snap)
