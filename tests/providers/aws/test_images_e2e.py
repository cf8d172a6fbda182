"""`gpucloud image build` then `run` through the real CLI against moto + the AWS simulator: the
builder is a run that leaves nothing behind, the image is tagged with the
stack hash, `plan` picks it, the run boots it and its stack stage installs nothing (the stubs count
apt-get and pip installs: 0), `gc` keeps it, `image rm` deletes it and its snapshots.

The simulator models an AMI's disk: an instance launched from an image that CreateImage took of a
simulated instance starts with that instance's installed packages (tests/support/aws_sim.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.aws_runs import hooked_cli  # noqa: F401
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.cli import cli
from tests.support.moto_server import Moto, moto, moto_server, tagged_alive  # noqa: F401
from tests.support.text import flat
from tests.support.vm_sim import guest_calls, install_calls

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
REGION = "us-east-1"


def _job(tmp_path: Path) -> Path:
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: baked\nresources:\n  cloud: aws\n  regions: [us-east-1]\n  gpu: T4:1\n"
        "stack: {framework: pytorch}\nmax_duration: 15m\nrun: echo first-line-of-the-job\n"
    )
    return job


def _no_baked_images(ec2: Any) -> None:
    """The worker's moto server is shared: images another test baked are deregistered first, so
    these tests start from an account without any."""
    for image in ec2.describe_images(Owners=["self"], Filters=[{"Name": "tag:gpucloud:kind", "Values": ["image"]}])[
        "Images"
    ]:
        ec2.deregister_image(ImageId=image["ImageId"])


def test_image_build_then_run_installs_nothing(
    aws_env: dict[str, str],
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in aws_env.items() if k != "GPUCLOUD_TEST_AWS_RECORD"}
    job = _job(tmp_path)
    ec2 = moto.client("ec2", REGION)
    _no_baked_images(ec2)

    built = hooked_cli(
        env, "image", "build", str(job), "--cloud", "aws", "--region", REGION, "--yes", "--json", timeout=300
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-4000:]
    doc = json.loads(built.stdout.strip().splitlines()[-1])
    assert doc["built"] is True and doc["ref"].startswith("ami-")
    image = ec2.describe_images(ImageIds=[doc["ref"]])["Images"][0]
    tags = {t["Key"]: t["Value"] for t in image["Tags"]}
    assert tags["gpucloud:stack-hash"] == doc["stack_hash"] and tags["gpucloud:kind"] == "image"
    builder = aws_sim.booted[-1]
    assert install_calls(guest_calls(aws_sim, builder)), "the builder installed the stack"
    assert tagged_alive(moto) == [], "the builder is torn down like a run"

    again = hooked_cli(env, "image", "build", str(job), "--cloud", "aws", "--region", REGION, "--yes", "--json")
    assert again.returncode == 0 and json.loads(again.stdout.strip().splitlines()[-1])["built"] is False
    assert aws_sim.booted[-1] == builder, "an image with the same stack hash is not baked twice"

    plan = hooked_cli(env, "plan", str(job), "--json")
    assert plan.returncode == 0, plan.stderr
    first = json.loads(plan.stdout)["candidates"][0]
    assert first["image"]["found_by"] == "baked" and first["image"]["ref"] == doc["ref"]

    run = hooked_cli(env, "run", str(job), "--json", timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    node = aws_sim.booted[-1]
    assert node != builder
    assert ec2.describe_instances(InstanceIds=[node])["Reservations"][0]["Instances"][0]["ImageId"] == doc["ref"]
    assert json.loads(run.stdout)["status"] == "succeeded"
    calls = guest_calls(aws_sim, node)
    assert install_calls(calls) == [], calls  # 0 apt-get installs, 0 pip installs
    assert not [c for c in calls if c.startswith("dpkg -i")]
    assert any(c.startswith("nvidia-smi") for c in calls), "the stack stage still checked the driver"

    gc = hooked_cli(env, "gc", "--yes")
    assert gc.returncode == 0 and "1 baked image(s) kept" in flat(gc.stderr)
    assert ec2.describe_images(ImageIds=[doc["ref"]])["Images"], "gc never deletes a baked image"

    listed = hooked_cli(env, "image", "ls", "--cloud", "aws", "--region", REGION, "--json")
    assert [i["ref"] for i in json.loads(listed.stdout)] == [doc["ref"]]
    snapshots = [m["Ebs"]["SnapshotId"] for m in image.get("BlockDeviceMappings", []) if "Ebs" in m]
    removed = hooked_cli(env, "image", "rm", doc["ref"], "--cloud", "aws", "--region", REGION)
    assert removed.returncode == 0, removed.stderr
    assert not ec2.describe_images(Owners=["self"], Filters=[{"Name": "tag:gpucloud:kind", "Values": ["image"]}])[
        "Images"
    ]
    if snapshots:
        left = ec2.describe_snapshots(Filters=[{"Name": "snapshot-id", "Values": snapshots}])["Snapshots"]
        assert left == []
    replan = hooked_cli(env, "plan", str(job), "--json")
    assert json.loads(replan.stdout)["candidates"][0]["image"]["found_by"] != "baked"


def test_a_failing_builder_leaves_nothing_and_bakes_nothing(
    aws_env: dict[str, str],
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in aws_env.items() if k != "GPUCLOUD_TEST_AWS_RECORD"}
    job = _job(tmp_path)
    job.write_text(job.read_text() + "setup: exit 3\n")
    _no_baked_images(moto.client("ec2", REGION))
    out = hooked_cli(
        env, "image", "build", str(job), "--cloud", "aws", "--region", REGION, "--with-setup", "--yes", timeout=300
    )
    assert out.returncode != 0 and "no image was made" in flat(out.stderr), out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert tagged_alive(moto) == []
    ec2 = moto.client("ec2", REGION)
    assert not ec2.describe_images(Owners=["self"], Filters=[{"Name": "tag:gpucloud:kind", "Values": ["image"]}])[
        "Images"
    ]


def test_declining_the_image_build_prompt_exits_1_and_boots_nothing(
    aws_env: dict[str, str],
    moto: Moto,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The prompt only appears on a terminal, so stdin is a pseudo-terminal that answers "n"."""
    import os
    import pty

    env = {k: v for k, v in aws_env.items() if k != "GPUCLOUD_TEST_AWS_RECORD"}
    primary, secondary = pty.openpty()
    try:
        os.write(primary, b"n\n")
        proc = cli(
            "image",
            "build",
            str(_job(tmp_path)),
            "--cloud",
            "aws",
            "--region",
            REGION,
            terminal=secondary,
            env=env,
            cwd=tmp_path,
            timeout=120,
        )
    finally:
        os.close(secondary)
        os.close(primary)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Boot a builder and bake the image?" in flat(proc.stderr) and "no image built" in flat(proc.stderr)
    assert "Traceback" not in proc.stderr
    assert tagged_alive(moto) == []
