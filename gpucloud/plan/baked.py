"""`gpucloud image build/ls/rm` core: bake a stack into an image, find it again.

A baked image is named by a hash of everything the stack stage would install (driver branch and
modules, CUDA/cuDNN when asked, fabric manager, framework wheel, base image, CPU architecture and
optionally the job's `setup`). A later run whose stack hashes the same boots that image and its
stack stage finds every part present: it installs nothing (tests/vm/test_bootstrap.py simulates that).

Cloud calls go through the small `ImageStore` protocol (provider contract; the registry's `image_store`, e.g.
gpucloud/providers/aws/bake.py). `gpucloud image build` boots the builder as a run
(gpucloud/run/bake.py: journal intents, teardown in `finally`). Which images exist is also kept
locally (`images.json` in the gpucloud home, written by build, refreshed by `image ls`, pruned by
`image rm`), so that `plan` can pick a baked image without calling a cloud.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from gpucloud.contract.provider import HASH_TAG, KIND_TAG, KIND_VALUE, STACK_TAG, BakedImage, Image, ImageStore

if TYPE_CHECKING:
    from gpucloud.plan.images import NodeStack
    from gpucloud.plan.stack_data import Stack

SETUP_TAG = "gpucloud:with-setup"  # "yes" when the job's `setup` was baked in too
INDEX_FILE = "images.json"


def stack_hash(stack: Stack, node: NodeStack, setup: str | None = None) -> str:
    """16 hex digits over what the stack stage installs; equal hashes = interchangeable images."""
    doc = {
        "driver": stack.driver,
        "modules": stack.kernel_modules,
        "driver_source": node.driver_source,
        "cuda": [*node.cuda_packages],
        "cudnn": [*node.cudnn_packages],
        "fabric_manager": node.fabric_manager,
        "framework": [*stack.framework_pip],
        "ubuntu": stack.ubuntu_version,
        "cpu_arch": node.cpu_arch,
        "base": node.image.ref if node.image else "",
        "setup": setup or "",
    }
    if node.engine_packages or node.toolkit_packages:  # a container job's host: engine and toolkit too
        doc["container"] = [*node.engine_packages, *node.toolkit_packages]
    if stack.container_image:  # baked with the job's image pulled: only that image's jobs match
        doc["container_image"] = stack.container_image
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def describe(stack: Stack) -> str:
    """The `gpucloud:stack` tag: readable, e.g. "K80 R470 CUDA 11.4 pytorch==2.1.2"."""
    fw = "none" if stack.framework == "none" else f"{stack.framework}=={stack.framework_version}"
    if stack.container_image:
        fw = "container host"
    return f"{stack.gpu or 'cpu'} R{stack.driver} CUDA {stack.cuda} {fw}"


def find_baked(store: ImageStore, region: str, wanted: str) -> BakedImage | None:
    """The newest baked image in `region` with this stack hash (what `plan` uses automatically)."""
    matches = [i for i in store.list_images(region) if i.stack_hash == wanted]
    return max(matches, key=lambda i: i.created) if matches else None


def baked_row(baked: BakedImage, stack: Stack, node: NodeStack) -> Image:
    """An images.csv-like row for a baked image: it has everything the stack stage would install."""
    return Image(
        cloud=node.image.cloud if node.image else "",
        name=f"baked {baked.stack_hash}",
        cpu_arch=node.cpu_arch,
        gpu_archs=(stack.architecture,),
        vm_feature="",
        ubuntu=stack.ubuntu_version,
        modules=stack.kernel_modules,
        driver=stack.driver,
        cuda=(stack.cuda,) if node.cuda_packages else (),
        cudnn=bool(node.cudnn_packages),
        fabric_manager=node.fabric_manager,
        extension="",
        found_by="baked",
        ref=baked.ref,
        source=f"built by `gpucloud image build` ({baked.tags.get(STACK_TAG, '')})",
        checked=baked.created[:7],
    )


def image_tags(stack: Stack, wanted: str, *, with_setup: bool = False) -> dict[str, str]:
    """The tags of a baked image: its stack hash, that it is an image (not a run), what it holds."""
    return {
        HASH_TAG: wanted,
        KIND_TAG: KIND_VALUE,
        STACK_TAG: describe(stack),
        SETUP_TAG: "yes" if with_setup else "no",
    }


# ---- the local index of baked images (plan reads it offline) ------------------------------------


def _index_path() -> Path:
    from gpucloud.state.home import home_dir

    return home_dir() / INDEX_FILE


def load_index() -> list[tuple[str, BakedImage]]:
    """(cloud, image) for every baked image this machine knows of. A missing or damaged file is an
    empty index: it only costs the automatic choice until `gpucloud image ls` rebuilds it."""
    try:
        doc = json.loads(_index_path().read_text())
        rows = doc["images"] if isinstance(doc, dict) else []
        return [
            (
                str(r["cloud"]),
                BakedImage(
                    ref=str(r["ref"]),
                    region=str(r["region"]),
                    name=str(r.get("name", "")),
                    stack_hash=str(r["stack_hash"]),
                    tags=dict(r.get("tags") or {}),
                    created=str(r.get("created", "")),
                ),
            )
            for r in rows
            if isinstance(r, dict)
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _save_index(rows: list[tuple[str, BakedImage]]) -> None:
    path = _index_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp.{os.getpid()}")
    tmp.write_text(json.dumps({"images": [{"cloud": c, **asdict(b)} for c, b in rows]}, indent=1))
    tmp.replace(path)


def remember(cloud: str, baked: BakedImage) -> None:
    """Record a new baked image (after `image build`)."""
    rows = [(c, b) for c, b in load_index() if not (c == cloud and b.region == baked.region and b.ref == baked.ref)]
    _save_index([*rows, (cloud, baked)])


def sync_region(cloud: str, region: str, images: list[BakedImage]) -> None:
    """Replace what the index says about one cloud region by what the cloud listed (`image ls`)."""
    rows = [(c, b) for c, b in load_index() if not (c == cloud and b.region == region)]
    _save_index([*rows, *((cloud, b) for b in images)])


LIST_WORKERS = 8  # regions listed at once by `image ls` without --region


def image_regions(cloud: str) -> list[str]:
    """Where a cloud's baked images may be: every region the catalog sells it in, and every region
    this machine has seen an image of (a build in a region the catalog does not list)."""
    from gpucloud.catalog import load_catalog

    known = {o.region for o in load_catalog().offerings if o.cloud == cloud}
    return sorted(known | {b.region for c, b in load_index() if c == cloud})


def list_everywhere(
    store: ImageStore, regions: list[str]
) -> tuple[list[BakedImage], dict[str, list[BakedImage]], list[str]]:
    """Every baked image in `regions`, newest first, listed a few regions at a time; (images, the
    regions that answered with what each listed, one line per region that could not be read). A
    cloud that cannot be used at all (credentials, endpoint) raises at once, and so does the first
    region's error when no region answered."""
    from concurrent.futures import ThreadPoolExecutor

    from gpucloud.errors import CloudAccessError, GpucloudError

    def one(region: str) -> list[BakedImage] | GpucloudError:
        try:
            return store.list_images(region)
        except CloudAccessError:
            raise
        except GpucloudError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=min(LIST_WORKERS, max(1, len(regions)))) as pool:
        results = list(pool.map(one, regions))
    answered = {r: out for r, out in zip(regions, results, strict=True) if not isinstance(out, GpucloudError)}
    failed = [(r, out) for r, out in zip(regions, results, strict=True) if isinstance(out, GpucloudError)]
    if failed and not answered:
        raise failed[0][1]
    problems = [f"{r}: {exc.message}" for r, exc in failed]
    images = sorted((i for found in answered.values() for i in found), key=lambda i: i.created, reverse=True)
    return images, answered, problems


def forget(cloud: str, region: str, ref: str) -> None:
    """Drop a deleted image (`image rm`)."""
    _save_index([(c, b) for c, b in load_index() if not (c == cloud and b.region == region and b.ref == ref)])


def index_by_hash() -> dict[tuple[str, str, str], BakedImage]:
    """(cloud, region, stack hash) -> the newest baked image with that hash."""
    out: dict[tuple[str, str, str], BakedImage] = {}
    for cloud, baked in sorted(load_index(), key=lambda row: row[1].created):
        out[(cloud, baked.region, baked.stack_hash)] = baked
    return out
