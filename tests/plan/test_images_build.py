"""A baked image against moto (server mode): tagged with its stack hash, found again, listed and removed.
The build itself (a builder booted as a run, torn down, reused) is tests/providers/aws/test_images_e2e.py's."""

from __future__ import annotations

from gpucloud.contract.provider import HASH_TAG, KIND_TAG, BakedImage
from gpucloud.plan.baked import baked_row, find_baked, image_tags, stack_hash
from gpucloud.plan.images import resolve_node
from gpucloud.plan.stacks import resolve_stack
from gpucloud.providers.aws.bake import AwsImageStore
from gpucloud.spec.load import StackSpec
from tests.support.moto_server import moto, moto_server  # noqa: F401

REGION = "us-east-1"


def k80():
    stack = resolve_stack("K80", StackSpec(framework="pytorch"))
    return stack, resolve_node(stack, "aws", "p2.xlarge", 1)


def test_stack_hash_changes_with_what_is_installed() -> None:
    stack, node = k80()
    assert stack_hash(stack, node) == stack_hash(*k80())
    assert stack_hash(stack, node, setup="pip install x") != stack_hash(stack, node)
    t4 = resolve_stack("T4", StackSpec(framework="pytorch"))
    assert stack_hash(t4, resolve_node(t4, "aws", "g4dn.xlarge", 1)) != stack_hash(stack, node)


def _baked(store: AwsImageStore, iid: str, stack: object, node: object) -> BakedImage:
    """The builder `iid` snapshotted as `gpucloud image build` does (run/bake.py): named and tagged by its hash."""
    wanted = stack_hash(stack, node)  # type: ignore[arg-type]
    name, tags = f"gpucloud-{wanted}", image_tags(stack, wanted)  # type: ignore[arg-type]
    ref = store.create_image(REGION, iid, name, tags)
    return BakedImage(ref=ref, region=REGION, name=name, stack_hash=wanted, tags=tags)


def _builder(ec2: object) -> str:
    base = ec2.describe_images(Owners=["099720109477"])["Images"][0]["ImageId"]  # type: ignore[attr-defined]
    run = ec2.run_instances(ImageId=base, InstanceType="t3.micro", MinCount=1, MaxCount=1)  # type: ignore[attr-defined]
    return str(run["Instances"][0]["InstanceId"])


def test_a_baked_image_is_tagged_and_found_by_its_stack_hash(moto) -> None:  # noqa: F811
    ec2 = moto.client("ec2", REGION)
    store = AwsImageStore()
    stack, node = k80()
    iid = _builder(ec2)
    baked = _baked(store, iid, stack, node)
    ec2.terminate_instances(InstanceIds=[iid])
    try:
        image = ec2.describe_images(ImageIds=[baked.ref])["Images"][0]
        tags = {t["Key"]: t["Value"] for t in image["Tags"]}
        assert tags[HASH_TAG] == stack_hash(stack, node) and tags[KIND_TAG] == "image"
        found = find_baked(store, REGION, stack_hash(stack, node))
        assert found is not None and found.ref == baked.ref
        row = baked_row(found, stack, node)
        assert row.found_by == "baked" and row.driver == "470" and row.ref == baked.ref
    finally:
        store.delete_image(REGION, baked.ref)
    assert find_baked(store, REGION, stack_hash(stack, node)) is None


def test_image_ls_and_rm_commands(moto) -> None:  # noqa: F811
    import json

    from typer.testing import CliRunner

    from gpucloud.cli.app import app

    ec2 = moto.client("ec2", REGION)
    base = ec2.describe_images(Owners=["099720109477"])["Images"][0]["ImageId"]
    runner = CliRunner()

    def listed(*where: str) -> list[dict[str, str]]:
        out = runner.invoke(app, ["image", "ls", "--cloud", "aws", *where, "--json"])
        assert out.exit_code == 0, out.output
        return list(json.loads(out.stdout))

    # The worker's moto server is shared by the files it runs: images another file baked stay listed.
    before = {d["ref"] for d in listed()}
    iid = _builder(ec2)
    stack, node = k80()
    baked = _baked(AwsImageStore(), iid, stack, node)
    ec2.terminate_instances(InstanceIds=[iid])
    here = [d for d in listed("--region", REGION) if d["ref"] not in before]
    assert [d["ref"] for d in here] == [baked.ref]
    assert here[0]["stack"].startswith("K80 R470")
    everywhere = [d for d in listed() if d["ref"] not in before]  # no --region: every region
    assert [(d["ref"], d["region"]) for d in everywhere] == [(baked.ref, REGION)]
    bad = runner.invoke(app, ["image", "rm", base, "--cloud", "aws", "--region", REGION])
    assert bad.exit_code == 2 and "not a gpucloud baked image" in bad.output  # Canonical's AMI is not ours
    ok = runner.invoke(app, ["image", "rm", baked.ref, "--cloud", "aws", "--region", REGION])
    assert ok.exit_code == 0 and find_baked(AwsImageStore(), REGION, baked.stack_hash) is None
    unsupported = runner.invoke(app, ["image", "ls", "--cloud", "local", "--region", "eastus"])
    assert unsupported.exit_code == 2  # "this machine has no baked images", as a UserError


def test_the_plans_image_is_what_an_aws_run_boots(moto) -> None:  # noqa: F811
    """A vendor image's public SSM parameter is read; a baked image boots by id; a missing vendor
    parameter falls back to Canonical's Ubuntu of the stack (the bootstrap installs the rest)."""
    from dataclasses import replace

    from moto.core.utils import utcnow
    from moto.ssm.models import Parameter, ssm_backends

    from gpucloud.plan.images import load_images
    from gpucloud.providers.aws import AwsProvider
    from tests.support.moto_server import ACCOUNT, seed_ubuntu_images

    ubuntu = seed_ubuntu_images(moto, [REGION])
    ec2 = moto.client("ec2", REGION)
    vendor_ami = ec2.describe_images(ImageIds=[ubuntu[(REGION, "20.04")]])["Images"][0]["ImageId"]
    dlami = next(i for i in load_images() if i.name == "dlami-base-oss")
    ssm_backends[ACCOUNT][REGION]._parameters[dlami.ref] = [
        Parameter(  # noqa: SLF001 - what AWS publishes
            account_id=ACCOUNT,
            name=dlami.ref,
            value=vendor_ami,
            parameter_type="String",
            description=None,
            allowed_pattern=None,
            keyid=None,
            last_modified_date=utcnow(),
            version=1,
            data_type="aws:ec2:image",
        )
    ]
    try:
        assert AwsProvider().resolve_image(REGION, "22.04", "auto", dlami)[0] == vendor_ami
    finally:
        del ssm_backends[ACCOUNT][REGION]._parameters[dlami.ref]  # noqa: SLF001
    assert AwsProvider().resolve_image(REGION, "22.04", "auto", dlami)[0] == ubuntu[(REGION, "22.04")]
    baked = replace(dlami, found_by="baked", ref=ubuntu[(REGION, "24.04")])
    assert AwsProvider().resolve_image(REGION, "22.04", "auto", baked)[0] == ubuntu[(REGION, "24.04")]
    # `image:` in the job file still wins over the plan's image
    assert AwsProvider().resolve_image(REGION, "22.04", vendor_ami, baked)[0] == vendor_ami


def test_grid_extension_body_and_azure_image_reference() -> None:
    from gpucloud.plan.images import load_images
    from gpucloud.providers.azure.machine import driver_extension_body, image_reference

    grid = next(i for i in load_images() if i.vm_feature == "grid")
    body = driver_extension_body("eastus", grid.extension, {"gpucloud-run": "r1"}, "Standard_NV36ads_A10_v5")
    assert body["properties"]["publisher"] == "Microsoft.HpcCompute" and body["properties"]["type"] == grid.extension
    assert body["properties"]["settings"] == {"driverVersion": "535.161"}  # GRID 17.x: CUDA bug on A10
    # the GRID row boots plain Ubuntu (the extension brings the driver); the HPC image by its URN
    assert image_reference("auto", "22.04", "Standard_NV36ads_A10_v5", "A10", grid)["offer"].endswith("jammy")
    hpc = next(i for i in load_images() if i.name == "ubuntu-hpc-22.04")
    assert image_reference("auto", "22.04", "Standard_ND96asr_v4", "A100-40GB", hpc) == {
        "publisher": "microsoft-dsvm",
        "offer": "ubuntu-hpc",
        "sku": "2204",
        "version": "latest",
    }
