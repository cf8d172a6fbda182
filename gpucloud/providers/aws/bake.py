"""Baked images on EC2 (issue 13, item 3): snapshot a builder instance, list and delete the results.

Three calls, each a thin wrapper over the shared boto3 clients (providers/aws/session.py: bounded
timeouts, AWS_ENDPOINT_URL honoured, so tests point it at moto). The images are tagged
`gpucloud:kind=image`: the reaper and `gc` look for run tags and never touch them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpucloud.images_build import HASH_TAG, KIND_TAG, KIND_VALUE, BakedImage


def _ec2(region: str) -> Any:
    from gpucloud.providers.aws.session import shared_client, shared_session

    return shared_client(shared_session(), "ec2", region)


@contextmanager
def _access_errors(what: str) -> Iterator[None]:
    """Missing or refused credentials and a dead endpoint become CredentialsError / EndpointError
    (access.py), so `image ls/rm` fail with exit 78 and the fix, not as an internal error."""
    from botocore.exceptions import BotoCoreError, ClientError

    from gpucloud.providers.aws.access import classify_access

    try:
        yield
    except (ClientError, BotoCoreError) as exc:
        access = classify_access(exc, what=what)
        if access is not None:
            raise access from None
        raise


class AwsImageStore:
    """`ImageStore` for EC2: CreateImage / DescribeImages(Owners=self) / DeregisterImage + snapshots."""

    def create_image(self, region: str, instance_id: str, name: str, tags: dict[str, str]) -> str:
        tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
        ec2 = _ec2(region)
        with _access_errors("creating an image"):
            resp = ec2.create_image(InstanceId=instance_id, Name=name,
                                    Description=tags.get("gpucloud:stack", name)[:255],
                                    TagSpecifications=[{"ResourceType": "image", "Tags": tag_list}])
            ref = str(resp["ImageId"])
            # The snapshots get the same tags (so `gc` and cost reports see them) in a second call:
            # not every EC2 implementation accepts a "snapshot" TagSpecification on CreateImage.
            snapshots = self._snapshots(ec2, ref)
            if snapshots:
                ec2.create_tags(Resources=snapshots, Tags=tag_list)
        return ref

    @staticmethod
    def _snapshots(ec2: Any, ref: str) -> list[str]:
        images = ec2.describe_images(ImageIds=[ref]).get("Images", [])
        return [m["Ebs"]["SnapshotId"] for i in images for m in i.get("BlockDeviceMappings", [])
                if m.get("Ebs", {}).get("SnapshotId")]

    def list_images(self, region: str) -> list[BakedImage]:
        with _access_errors("listing images"):
            resp = _ec2(region).describe_images(Owners=["self"],
                                                Filters=[{"Name": f"tag:{KIND_TAG}", "Values": [KIND_VALUE]}])
        out = []
        for image in resp.get("Images", []):
            tags = {t["Key"]: t["Value"] for t in image.get("Tags", [])}
            out.append(BakedImage(ref=image["ImageId"], region=region, name=image.get("Name", ""),
                                  stack_hash=tags.get(HASH_TAG, ""), tags=tags,
                                  created=str(image.get("CreationDate", ""))))
        return out

    def delete_image(self, region: str, ref: str) -> None:
        ec2 = _ec2(region)
        with _access_errors("deleting an image"):
            snapshots = self._snapshots(ec2, ref)
            ec2.deregister_image(ImageId=ref)
            for snap in snapshots:  # a deregistered AMI leaves its snapshots (and their bill) behind
                ec2.delete_snapshot(SnapshotId=snap)
