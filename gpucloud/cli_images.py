"""`gpucloud image build / ls / rm`: the baked images gpucloud made (issue 13, item 3).

A typer sub-app registered by cli.py (`app.add_typer(image_app, name="image")`), which also wraps
every command in its error handler; like cli.py, each command imports the module that does the
work inside its body, so `gpucloud --help` imports no cloud SDK.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

image_app = typer.Typer(help="Baked GPU images (the stack installed once, reused by later runs).",
                        no_args_is_help=True, rich_markup_mode=None)

CloudArg = Annotated[str, typer.Option("--cloud", help="The provider whose images to use.")]
RegionArg = Annotated[str, typer.Option("--region", help="The region the images live in.")]


@image_app.command("ls")
def list_images(cloud: CloudArg, region: RegionArg,
                json_out: Annotated[bool, typer.Option("--json", help="One JSON document.")] = False) -> None:
    """Baked images in one region, newest first, with their stack and stack hash."""
    from gpucloud import providers

    images = sorted(providers.image_store(cloud).list_images(region), key=lambda i: i.created, reverse=True)
    if json_out:
        print(json.dumps([{"ref": i.ref, "region": i.region, "name": i.name, "stack_hash": i.stack_hash,
                           "stack": i.tags.get("gpucloud:stack", ""), "created": i.created} for i in images]))
        return
    for i in images:
        print(f"{i.ref}  {i.stack_hash}  {i.created or '-'}  {i.tags.get('gpucloud:stack', '')}")
    if not images:
        print(f"no baked images in {region}")


@image_app.command("rm")
def remove_image(ref: Annotated[str, typer.Argument(help="Image id from `image ls`.")], cloud: CloudArg,
                 region: RegionArg) -> None:
    """Delete a baked image and its snapshots (only images gpucloud made)."""
    from gpucloud import providers
    from gpucloud.errors import UserError

    store = providers.image_store(cloud)
    if ref not in {i.ref for i in store.list_images(region)}:
        raise UserError(f"{ref} is not a gpucloud baked image in {region}.", hint="See `gpucloud image ls`.")
    store.delete_image(region, ref)
    print(f"deleted {ref}")
