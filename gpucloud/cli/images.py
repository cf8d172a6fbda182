"""`gpucloud image build / ls / rm`: the baked images gpucloud made.

A typer sub-app registered by cli.py (`app.add_typer(image_app, name="image")`), which also wraps
every command in its error handler; like cli.py, each command imports the module that does the
work inside its body, so `gpucloud --help` imports no cloud SDK.
"""

from __future__ import annotations

from typing import Annotated

import typer

from gpucloud.ui import jsonout

image_app = typer.Typer(
    help="Baked GPU images (the stack installed once, reused by later runs).",
    no_args_is_help=True,
    rich_markup_mode=None,
)

CloudArg = Annotated[str, typer.Option("--cloud", help="The provider whose images to use.")]
RegionArg = Annotated[str, typer.Option("--region", help="The region the images live in.")]


@image_app.command("build")
def build_image(
    target: Annotated[str, typer.Argument(metavar="SPEC|GPU", help="A job file, or a GPU name such as T4.")],
    cloud: Annotated[str | None, typer.Option("--cloud", help="The provider to bake on (default: the plan's).")] = None,
    region: Annotated[str | None, typer.Option("--region", help="Only this region.")] = None,
    framework: Annotated[str | None, typer.Option("--framework", help="With GPU: pytorch, tensorflow or none.")] = None,
    with_setup: Annotated[bool, typer.Option("--with-setup", help="Bake the job's `setup` in too.")] = False,
    assume_yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document.")] = False,
) -> None:
    """Boot a builder once, install the stack, snapshot it and tear the builder down; later runs
    whose stack hashes the same boot that image and install nothing."""
    import sys

    from gpucloud.run.bake import build

    baked, built = build(
        target,
        cloud=cloud,
        region=region,
        with_setup=with_setup,
        framework=framework,
        assume_yes=assume_yes or not sys.stdin.isatty(),
        json_out=json_out,
    )
    if json_out:
        print(
            jsonout.dumps(
                {
                    "ref": baked.ref,
                    "region": baked.region,
                    "stack_hash": baked.stack_hash,
                    "stack": baked.tags.get("gpucloud:stack", ""),
                    "built": built,
                },
                indent=None,
            )
        )
        return
    print(
        f"{baked.ref}  {baked.region}  {baked.stack_hash}  " + ("built" if built else "already baked: nothing booted")
    )


@image_app.command("ls")
def list_images(
    cloud: CloudArg,
    region: Annotated[
        str | None, typer.Option("--region", help="Only this region (default: every region of the cloud's catalog).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON document.")] = False,
) -> None:
    """Baked images, newest first, with their region, stack and stack hash."""
    from gpucloud.contract import registry as providers
    from gpucloud.plan.baked import image_regions, list_everywhere, sync_region
    from gpucloud.ui.views import note

    regions = [region] if region else image_regions(cloud)
    images, answered, problems = list_everywhere(providers.image_store(cloud), regions)
    for line in problems:
        note(f"warning: not listed: {line}")
    for listed, found in answered.items():
        sync_region(cloud, listed, found)  # what `plan` picks from, offline
    if json_out:
        print(
            jsonout.dumps(
                [
                    {
                        "ref": i.ref,
                        "region": i.region,
                        "name": i.name,
                        "stack_hash": i.stack_hash,
                        "stack": i.tags.get("gpucloud:stack", ""),
                        "created": i.created,
                    }
                    for i in images
                ],
                indent=None,
            )
        )
        return
    for i in images:
        print(f"{i.ref}  {i.region}  {i.stack_hash}  {i.created or '-'}  {i.tags.get('gpucloud:stack', '')}")
    if not images:
        print(f"no baked images in {region or f'any of the {len(answered)} {cloud} regions listed'}")


@image_app.command("rm")
def remove_image(
    ref: Annotated[str, typer.Argument(help="Image id from `image ls`.")], cloud: CloudArg, region: RegionArg
) -> None:
    """Delete a baked image and its snapshots (only images gpucloud made)."""
    from gpucloud.contract import registry as providers
    from gpucloud.errors import UserError

    store = providers.image_store(cloud)
    if ref not in {i.ref for i in store.list_images(region)}:
        raise UserError(f"{ref} is not a gpucloud baked image in {region}.", hint="See `gpucloud image ls`.")
    store.delete_image(region, ref)
    from gpucloud.plan.baked import forget

    forget(cloud, region, ref)
    print(f"deleted {ref}")
