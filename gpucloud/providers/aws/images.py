"""Which AMI a run boots, and in which zones of a region it can launch (docs/PROVIDERS.md, "AWS images").

The job's `image:` is checked for its format by spec.py; here it only has to be an AMI (an Azure
URN passes the spec but cannot run on EC2) and exist in the region. Otherwise the plan's image
(gpucloud/plan/images.py, docs/STACKS.md) decides: a baked AMI by id, a vendor image (Deep Learning
Base AMI) or Canonical's Ubuntu through its public SSM parameter. Where a vendor parameter cannot
be read, Canonical's Ubuntu of the stack's version is booted instead (the bootstrap then installs
what the vendor image would have had); Ubuntu's own parameter falls back to DescribeImages of
Canonical's account.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpucloud.contract.provider import FatalProvisionError, ImageMissingError
from gpucloud.providers.aws.errors import error_code
from gpucloud.providers.aws.session import AwsClients

if TYPE_CHECKING:
    from gpucloud.contract.provider import Image

CANONICAL_OWNER = "099720109477"
UBUNTU_CODENAMES = {"18.04": "bionic", "20.04": "focal", "22.04": "jammy", "24.04": "noble"}


def resolve_image(
    aws: AwsClients,
    cache: dict[tuple[str, str], tuple[str, str]],
    region: str,
    ubuntu_version: str,
    image: str = "auto",
    chosen: Image | None = None,
    *,
    cpu_arch: str = "x86_64",
    warn: Callable[[str], None] | None = None,
) -> tuple[str, str]:
    """(AMI id, root device name), remembered in `cache` per region and image. `chosen`: the
    plan's image for this candidate (used when the job file leaves `image:` at auto); `cpu_arch`:
    the instance type's ("x86_64" | "arm64"), which a fallback Ubuntu image must match; `warn`
    says which image a vendor image's failed lookup fell back to, and why."""
    planned = chosen if image == "auto" and chosen is not None and chosen.found_by in ("ssm", "baked") else None
    arch = planned.cpu_arch if planned is not None else cpu_arch
    key = (region, image if image != "auto" else (planned.ref if planned else f"ubuntu-{ubuntu_version}-{arch}"))
    if key in cache:
        return cache[key]
    from botocore.exceptions import ClientError

    if image != "auto":
        if not image.startswith("ami-"):
            raise FatalProvisionError(
                f"image {image!r} is not an AMI id (ami-...), so it cannot run on AWS.",
                hint="Use an ami-... id, or `image: auto`.",
            )
        ami = image
    elif planned is not None and planned.found_by == "baked":
        ami = planned.ref
    elif planned is not None:
        vendor = ssm_ami(aws, region, planned.ref)
        ami = vendor or ubuntu_ami(aws, region, ubuntu_version, arch)
        if vendor is None and warn is not None:
            warn(
                f"image {planned.name} ({planned.ref}) is not published in {region} or may not be read: booting "
                f"Canonical's Ubuntu {ubuntu_version} ({arch}) {ami} instead; its stack stage installs the driver "
                "and the rest from NVIDIA's repository (slower boot, same stack)."
            )
    else:
        ami = ubuntu_ami(aws, region, ubuntu_version, arch)
    try:
        found = aws.ec2("describe_images", region, ImageIds=[ami]).get("Images", [])
    except ClientError as exc:
        if "InvalidAMIID" not in error_code(exc):
            raise
        found = []
    if not found:
        raise ImageMissingError(
            f"AMI {ami} does not exist in {region} (or is not shared with this account).",
            code="InvalidAMIID.NotFound",
            hint="AMI ids are per region; check `image:`.",
        )
    cache[key] = (ami, found[0].get("RootDeviceName") or "/dev/sda1")
    ROOT_GB[(region, ami)] = root_snapshot_gb(found[0])
    return cache[key]


# What DescribeImages said of each AMI's root snapshot (GiB; 0 when it did not say): a fact about
# the image that never changes, read once with the image itself.
ROOT_GB: dict[tuple[str, str], int] = {}


def root_snapshot_gb(image: dict[str, Any]) -> int:
    """The size of the AMI's root volume snapshot (its root device's `Ebs.VolumeSize`), else 0."""
    root = image.get("RootDeviceName")
    for mapping in image.get("BlockDeviceMappings") or []:
        size = (mapping.get("Ebs") or {}).get("VolumeSize")
        if mapping.get("DeviceName") == root and isinstance(size, int):
            return size
    return 0


def check_disk(region: str, ami: str, disk_gb: int) -> None:
    """resources.disk_gb below the AMI's root snapshot: refused before RunInstances with the size and
    the fix (EC2's own InvalidBlockDeviceMapping names neither the job file's field nor the fix)."""
    snapshot = ROOT_GB.get((region, ami), 0)
    if snapshot and disk_gb < snapshot:
        raise FatalProvisionError(
            f"resources.disk_gb is {disk_gb} GB, but the image {ami} in {region} has a {snapshot} GB root "
            "snapshot, and a disk cannot be smaller than the snapshot it starts from.",
            hint=f"Set resources.disk_gb to {snapshot} or more in the job file (or use a smaller image).",
        )


def ssm_ami(aws: AwsClients, region: str, parameter: str) -> str | None:
    """The AMI id a public SSM parameter names (e.g. a Deep Learning Base AMI's), or None where the
    parameter does not exist in the region or may not be read."""
    from botocore.exceptions import ClientError

    try:
        return str(aws.call(aws.client("ssm", region), "get_parameter", Name=parameter)["Parameter"]["Value"])
    except ClientError as exc:
        if "ParameterNotFound" in error_code(exc) or "AccessDenied" in error_code(exc):
            return None
        raise


# Canonical's names for the CPU architectures (SSM path part and AMI name) [V: FACTS audit: ARCH amd64 | arm64].
UBUNTU_ARCH = {"x86_64": "amd64", "arm64": "arm64"}


def ubuntu_ami(aws: AwsClients, region: str, version: str, cpu_arch: str = "x86_64") -> str:
    """Canonical's current Ubuntu AMI (EBS) of `version` for `cpu_arch` in `region`."""
    arch = UBUNTU_ARCH.get(cpu_arch)
    if arch is None:
        raise FatalProvisionError(
            f"no Ubuntu image is known for CPU architecture {cpu_arch!r} on AWS.",
            hint="Set `image:` to an AMI id built for that architecture.",
        )
    volume = "ebs-gp3" if version >= "24.04" else "ebs-gp2"
    found = ssm_ami(
        aws, region, f"/aws/service/canonical/ubuntu/server/{version}/stable/current/{arch}/hvm/{volume}/ami-id"
    )
    if found:
        return found
    code = UBUNTU_CODENAMES.get(version)
    if code is None:
        raise FatalProvisionError(f"no Ubuntu {version} image is known on AWS.", hint="Set `image:` to an AMI id.")
    images = aws.ec2(
        "describe_images",
        region,
        Owners=[CANONICAL_OWNER],
        Filters=[
            {"Name": "name", "Values": [f"ubuntu/images/hvm-ssd*/ubuntu-{code}-{version}-{arch}-server-*"]},
            {"Name": "state", "Values": ["available"]},
        ],
    ).get("Images", [])
    if not images:
        raise ImageMissingError(
            f"found no Canonical Ubuntu {version} ({arch}) AMI in {region}.",
            hint="Set `image:` to an AMI id for that region.",
        )
    return str(max(images, key=lambda i: (i.get("CreationDate", ""), i.get("Name", "")))["ImageId"])


def zones(aws: AwsClients, region: str, instance_type: str) -> tuple[str, list[tuple[str, str | None]]]:
    """The default VPC and the (zone, default subnet) pairs to try in order: only zones that
    offer the type when AWS says which (saves a failed RunInstances per zone)."""
    vpcs = aws.ec2("describe_vpcs", region, Filters=[{"Name": "isDefault", "Values": ["true"]}]).get("Vpcs", [])
    if not vpcs:
        raise FatalProvisionError(
            f"{region} has no default VPC, which gpucloud launches into.",
            hint=f"Create one with `aws ec2 create-default-vpc --region {region}`.",
        )
    subnets: list[dict[str, Any]] = aws.ec2(
        "describe_subnets",
        region,
        Filters=[{"Name": "vpc-id", "Values": [vpcs[0]["VpcId"]]}, {"Name": "default-for-az", "Values": ["true"]}],
    ).get("Subnets", [])
    by_zone = {s["AvailabilityZone"]: s["SubnetId"] for s in subnets}
    offered = aws.ec2(
        "describe_instance_type_offerings",
        region,
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": [instance_type]}],
    ).get("InstanceTypeOfferings", [])
    names = sorted({o["Location"] for o in offered} & set(by_zone)) or sorted(by_zone)
    return vpcs[0]["VpcId"], [(z, by_zone.get(z)) for z in names] or [("", None)]
