"""Which CUDA a `container:` image was built for, so that the plan can check the host's driver and
GPU against it (gpucloud/plan/container_stack.py).

Sources, best first: the image's registry (the config's CUDA_VERSION / com.nvidia.cuda.version,
gpucloud/plan/oci_client.py, under a 3 s budget); the tag (`...-cuda12.1-...`, `cu121`, and
nvidia/cuda's leading version `12.6.1-base-...`); for NGC framework images (`nvcr.io/nvidia/pytorch:
24.08-py3`) the release -> CUDA table in catalog/data/ngc_cuda.csv, sourced per row from NVIDIA's
release notes; else unknown, with a warning in the plan. Only a job with `container:` imports this.
"""

from __future__ import annotations

import csv
import functools
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources import files
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpucloud.spec.container import ContainerSpec, ImageRef

NGC_REGISTRY = "nvcr.io"
# Repositories whose tags start with the CUDA version they carry (nvidia/cuda: 12.6.1-base-ubuntu24.04).
VERSION_TAGGED = ("nvidia/cuda",)
_TAG_CUDA = re.compile(r"(?:^|[-_.])cuda[-_]?(\d{1,2})\.(\d{1,2})(?=$|[-_.])", re.IGNORECASE)
_TAG_CU = re.compile(r"(?:^|[-_.])cu(\d{2})(\d)(?=$|[-_.])")
_LEADING = re.compile(r"^(\d{1,2})\.(\d{1,2})(?:\.\d+)?(?=$|-)")
_NGC_RELEASE = re.compile(r"^(\d{2}\.\d{2})(?=$|-)")
SOURCES = ("registry", "tag", "ngc-table", "unknown")


@dataclass(frozen=True)
class ImageCuda:
    """The image and the CUDA it needs: `source` is one of SOURCES, `detail` how it was found (or why not)."""

    image: str
    registry: str
    cuda: str | None  # "12.6" (major.minor), None when unknown
    source: str
    detail: str
    warnings: tuple[str, ...] = ()
    size_bytes: int = 0  # what a pull downloads, read from the registry (0: unknown); the node's pull deadline

    @property
    def major(self) -> int | None:
        return int(self.cuda.split(".")[0]) if self.cuda else None

    def label(self) -> str:
        """ "nvcr.io/nvidia/pytorch:24.08-py3 (CUDA 12.6)" for messages."""
        return f"{self.image} (CUDA {self.cuda or 'unknown'})"


def cuda_from_tag(ref: ImageRef) -> tuple[str, str] | None:
    """(major.minor, how) when the tag names the CUDA: `cuda12.1`, `cu121`, nvidia/cuda's `12.6.1-...`."""
    tag = ref.tag or ""
    hit = _TAG_CUDA.search(tag)
    if hit:
        return f"{int(hit.group(1))}.{int(hit.group(2))}", f"the tag {tag!r} names cuda{hit.group(1)}.{hit.group(2)}"
    hit = _TAG_CU.search(tag)
    if hit:
        return f"{int(hit.group(1))}.{int(hit.group(2))}", f"the tag {tag!r} names cu{hit.group(1)}{hit.group(2)}"
    if any(ref.repository == r or ref.repository.endswith("/" + r) for r in VERSION_TAGGED):
        hit = _LEADING.match(tag)
        if hit:
            return f"{int(hit.group(1))}.{int(hit.group(2))}", f"{ref.repository} tags start with the CUDA version"
    return None


@functools.cache
def ngc_table() -> dict[tuple[str, str], tuple[str, str]]:
    """(repository, release) -> (CUDA major.minor, source) from catalog/data/ngc_cuda.csv."""
    text = files("gpucloud.catalog").joinpath("data", "ngc_cuda.csv").read_text(encoding="utf-8")
    return {(r["repository"], r["release"]): (r["cuda"], r["source"]) for r in csv.DictReader(io.StringIO(text))}


def cuda_from_ngc_release(ref: ImageRef) -> tuple[str, str] | None:
    """NGC framework images are tagged by release (24.08-py3); the table gives the release's CUDA."""
    if ref.registry != NGC_REGISTRY:
        return None
    hit = _NGC_RELEASE.match(ref.tag or "")
    row = ngc_table().get((ref.repository, hit.group(1))) if hit else None
    if hit is None or row is None:
        return None
    mark = row[1].split(" ", 1)[0]  # [V] / [C] / [R]: how the row was sourced (docs/STACKS.md 4b)
    return row[0], f"NGC release {hit.group(1)} of {ref.repository}, catalog/data/ngc_cuda.csv {mark}"


def image_cuda(
    container: ContainerSpec, secrets: Mapping[str, str] | None = None, *, gpu_job: bool = True
) -> ImageCuda:
    """The image's CUDA from the best source that knows it. A CPU-only job does not ask (no driver to
    check). A login's password is sent (basic auth, or to buy a token) only when its secret's value is
    here and the login is for the image's own registry."""
    ref = container.ref
    if not gpu_job:
        return ImageCuda(container.image, ref.registry, None, "unknown", "not asked: a CPU-only job has no driver")
    from gpucloud.plan.oci_client import Unknown, read_config

    creds, note = None, ""
    login = container.login
    if login is not None:
        value = (secrets or {}).get(login.password_secret)
        if value and container.registry == ref.registry:
            creds = (login.username, value)
        elif not value:
            note = f"; {login.password_secret} has no value here, so the registry was asked without the login"
    answer = read_config(ref, login=creds)
    size = 0 if isinstance(answer, Unknown) else answer.size_bytes
    if not isinstance(answer, Unknown) and answer.cuda:
        return ImageCuda(container.image, ref.registry, answer.cuda, "registry", answer.cuda_detail, size_bytes=size)
    why = (answer.reason if isinstance(answer, Unknown) else answer.cuda_detail) + note
    for found, source in ((cuda_from_tag(ref), "tag"), (cuda_from_ngc_release(ref), "ngc-table")):
        if found is not None:
            detail = f"{found[1]} (registry: {why})"
            return ImageCuda(container.image, ref.registry, found[0], source, detail, size_bytes=size)
    warning = (
        f"container: which CUDA {container.image} was built for is unknown (registry: {why}; the tag names none"
        f"{' and the NGC table has no such release' if ref.registry == NGC_REGISTRY else ''}), so the host driver "
        "was not checked against it; an image that needs a newer driver fails at its first CUDA call. A tag that "
        "names the CUDA (e.g. -cuda12.4-) or a registry gpucloud can reach lets the plan check it."
    )
    return ImageCuda(container.image, ref.registry, None, "unknown", why, (warning,), size_bytes=size)
