"""Baked images on EC2 (issue 13, item 3): snapshot a builder instance, list and delete the results.

Isolated from providers/aws.py (which is being restructured) so the lead can re-wire it: three
calls, each a thin boto3 wrapper. boto3 is imported lazily (`gpucloud --help` must not load it);
endpoints come from the standard AWS settings (AWS_ENDPOINT_URL), so tests point it at moto.
"""

from __future__ import annotations

from typing import Any

from gpucloud.images_build import HASH_TAG, KIND_TAG, KIND_VALUE, BakedImage


def _ec2(region: str) -> Any:
    import boto3

    return boto3.session.Session().client("ec2", region_name=region)


class AwsImageStore:
    """`ImageStore` for EC2: CreateImage / DescribeImages(Owners=self) / DeregisterImage + snapshots."""

    def create_image(self, region: str, instance_id: str, name: str, tags: dict[str, str]) -> str:
        tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
        ec2 = _ec2(region)
        resp = ec2.create_image(InstanceId=instance_id, Name=name, Description=tags.get("gpucloud:stack", name)[:255],
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
        resp = _ec2(region).describe_images(Owners=["self"], Filters=[{"Name": f"tag:{KIND_TAG}", "Values": [KIND_VALUE]}])
        out = []
        for image in resp.get("Images", []):
            tags = {t["Key"]: t["Value"] for t in image.get("Tags", [])}
            out.append(BakedImage(ref=image["ImageId"], region=region, name=image.get("Name", ""),
                                  stack_hash=tags.get(HASH_TAG, ""), tags=tags,
                                  created=str(image.get("CreationDate", ""))))
        return out

    def delete_image(self, region: str, ref: str) -> None:
        ec2 = _ec2(region)
        snapshots = self._snapshots(ec2, ref)
        ec2.deregister_image(ImageId=ref)
        for snap in snapshots:  # a deregistered AMI leaves its snapshots (and their bill) behind
            ec2.delete_snapshot(SnapshotId=snap)


def resolve_image_ref(region: str, found_by: str, ref: str) -> str:
    """The AMI id for an images.csv / job-file reference: an SSM parameter name is read (public
    parameters need only ssm:GetParameter), an AMI id is used as it is."""
    from gpucloud.errors import UserError

    if found_by != "ssm":
        return ref
    import boto3
    from botocore.exceptions import ClientError

    try:
        resp = boto3.session.Session().client("ssm", region_name=region).get_parameter(Name=ref)
    except ClientError as exc:
        raise UserError(f"Cannot read the public SSM parameter {ref} in {region}: "
                        f"{exc.response.get('Error', {}).get('Code', exc)}.",
                        hint="Allow ssm:GetParameter, or set `image:` in the job file to an AMI id.") from None
    return str(resp["Parameter"]["Value"])
