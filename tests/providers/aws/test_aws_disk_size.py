"""resources.disk_gb below the image's root snapshot is refused at launch, before RunInstances, with
the snapshot's size and the fix (EC2's own refusal names neither). moto's DescribeImages reports a
15 GB root snapshot whatever RegisterImage asked, so the request's disk is set below that (the
job file's floor is 20; a Deep Learning AMI's snapshot is larger than that)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpucloud.contract.provider import FatalProvisionError
from tests.support.aws_inproc import hooks, journal, provider  # noqa: F401  (fixtures)
from tests.support.aws_requests import make_request
from tests.support.moto_server import moto, moto_server  # noqa: F401


def _image_with_root(moto, gb: int) -> str:  # noqa: F811
    ec2 = moto.client("ec2")
    return ec2.register_image(
        Name=f"big-root-{gb}",
        RootDeviceName="/dev/sda1",
        BlockDeviceMappings=[{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": gb, "VolumeType": "gp3"}}],
        VirtualizationType="hvm",
        Architecture="x86_64",
    )["ImageId"]


def test_a_disk_smaller_than_the_image_snapshot_is_refused_before_run_instances(
    moto,  # noqa: F811
    provider,  # noqa: F811
    journal,  # noqa: F811
    hooks,  # noqa: F811
) -> None:
    ami = _image_with_root(moto, 75)
    snapshot = moto.client("ec2").describe_images(ImageIds=[ami])["Images"][0]["BlockDeviceMappings"][0]
    size = snapshot["Ebs"]["VolumeSize"]
    req = replace(make_request(image=ami), disk_gb=size - 5)
    with pytest.raises(FatalProvisionError) as exc:
        provider.provision(req, journal)
    text = f"{exc.value} {getattr(exc.value, 'hint', '')}"
    assert f"disk_gb is {size - 5} GB" in text and f"{size} GB root snapshot" in text and f"{size} or more" in text
    assert not hooks.ops("RunInstances")
