"""Which of a job's GPU requests an offering meets (`gpu: [L4:1, A10G:1]`, `A100|H100:8`, ranges).

Why a separate piece: the planner checks tens of thousands of rows, so each request is resolved
once against the catalog into the set of catalog GPU names it accepts (a family such as A100 is its
variants; a memory range is every GPU with that much memory) and a count range; a row is then
matched with two set/integer tests. The union of the names is what the catalog's index is asked
for, so rows of other GPUs are never read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpucloud.catalog import Catalog
    from gpucloud.catalog.models import Offering
    from gpucloud.contract.provider import Image
    from gpucloud.plan.container import ImageCuda
    from gpucloud.plan.images import NodeStack
    from gpucloud.plan.stacks import Stack
    from gpucloud.spec.load import JobSpec


class GpuMatch:
    """The job's GPU requests resolved against one catalog, in the order written."""

    def __init__(self, spec: JobSpec, cat: Catalog) -> None:
        res = spec.resources
        self.requests = res.gpu_requests
        self.ordered = res.gpu_order == "ordered"
        self.resolved: list[tuple[frozenset[str], int, int, str]] = []
        for req in self.requests:
            if req.models:
                names = {n for m in req.models for n in cat.members(m)}
            else:
                names = set(cat.gpus)
            if req.memory is not None:
                names = {n for n in names if req.takes_memory(cat.gpus[n].memory_gib)}
            self.resolved.append((frozenset(names), req.count, req.most, req.label()))
        self.variants = frozenset(n for names, _, _, _ in self.resolved for n in names)
        # One exact model and count: today's single request, planned and explained as before.
        only = self.requests[0] if len(self.requests) == 1 else None
        self.simple = only is not None and len(only.models) == 1 and only.memory is None and only.max_count is None
        labels = [label for _, _, _, label in self.resolved]
        self.asked = labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " or " + labels[-1]
        self._which: dict[tuple[str, int], int | None] = {}

    def which(self, off: Offering) -> int | None:
        """The index of the first request the offering meets, or None (memoised per GPU and count:
        a large catalog has tens of thousands of rows but a few dozen of those pairs)."""
        return self.which_of(off.gpu, off.gpu_count)

    def which_of(self, gpu: str, count: int) -> int | None:
        key = (gpu, count)
        hit = self._which.get(key, -1)
        if hit != -1:
            return hit
        found = None
        for i, (names, low, high, _) in enumerate(self.resolved):
            if gpu in names and low <= count <= high:
                found = i
                break
        self._which[key] = found
        return found

    def label(self, index: int) -> str:
        return self.resolved[index][3]

    def miss(self, off: Offering) -> str:
        """Why a row of an asked-for GPU meets no request (its count is outside every range)."""
        return f"has {off.gpu_count} × {off.gpu} per node, job asks for {self.asked}"

    def rank(self, index: int) -> int:
        """The request's place in the ranking: its index under `gpu_order: ordered`, else 0."""
        return index if self.ordered else 0

    def ranks(self) -> dict[str, int]:
        """Candidate.request (a label) -> its rank; the first request of a repeated label wins."""
        out: dict[str, int] = {}
        for i in range(len(self.resolved)):
            out.setdefault(self.label(i), self.rank(i))
        return out


class PlanStacks:
    """The stack of each GPU a plan may run on: one fixed stack for a single request (an error in
    the job's pins stops the plan, as before), else resolved per GPU, where a pin that does not fit
    one GPU excludes that GPU's offerings with the reason instead of stopping the plan. With a
    `container:` image (`image`), a GPU that cannot run it is excluded the same way, with that reason."""

    def __init__(self, spec: JobSpec, fixed: Stack | None, image: ImageCuda | None = None) -> None:
        self.pins, self.fixed, self.image = spec.stack, fixed, image
        self.per_gpu: dict[str, Stack | str] = {}
        self.used: set[str] = set()  # the GPUs of rows the plan considered: the plan lists their stacks

    def of(self, gpu: str) -> Stack | str:
        """The GPU's stack, or why the job's stack pins do not fit it."""
        self.used.add(gpu)
        return self.peek(gpu)

    def fits(self, gpu: str) -> bool:
        """Whether the job's pins fit the GPU, without counting it as one the plan considered."""
        return not isinstance(self.peek(gpu), str)

    def peek(self, gpu: str) -> Stack | str:
        if self.fixed is not None:
            return self.fixed
        hit = self.per_gpu.get(gpu)
        if hit is None:
            from gpucloud.errors import UserError

            try:
                hit = self._resolve(gpu)
            except UserError as exc:
                hit = getattr(exc, "reason", None) or f"the job's stack pins do not fit the {gpu}: {exc.message}"
            self.per_gpu[gpu] = hit
        return hit

    def _resolve(self, gpu: str) -> Stack:
        """The GPU's stack: a container job's host stack (imported only for such a job) or the usual one."""
        if self.image is not None:
            from gpucloud.plan.container_stack import container_stack

            return container_stack(gpu, self.pins, self.image)
        from gpucloud.plan.stacks import resolve_stack

        return resolve_stack(gpu, self.pins)

    def refusals(self, gpus: frozenset[str]) -> list[str]:
        """Each GPU's reason when none of `gpus` can run the job (pins or image), else []."""
        found = {g: self.peek(g) for g in sorted(gpus)}
        if any(not isinstance(s, str) for s in found.values()):
            return []
        return [str(s) for s in found.values()]

    def known(self) -> dict[str, Stack]:
        return {g: s for g, s in self.per_gpu.items() if g in self.used and not isinstance(s, str)}


class ImageChoice:
    """The image each candidate boots (gpucloud/plan/images.py): the job's `image:`, else a
    baked image of this stack in the candidate's region (`gpucloud image build`, found in the local
    index by stack hash, with or without the job's setup baked in), else the images.csv choice.
    Chosen once per (cloud, instance type, GPU count, CPU architecture), however many regions and
    markets offer it."""

    def __init__(self, stacks: PlanStacks, spec: JobSpec, *, baked: bool) -> None:
        from gpucloud.plan.baked import index_by_hash

        self.stacks, self.job_image, self.setup = stacks, spec.image, spec.setup
        self.index = index_by_hash() if baked and spec.image in ("", "auto") else {}
        self.chosen: dict[tuple[str, str, int, str], tuple[Image | None, NodeStack | None, tuple[str, ...]]] = {}

    def __call__(self, off: Offering) -> Image | None:
        key = (off.cloud, off.instance_type, off.gpu_count, off.arch)
        if key not in self.chosen:
            self.chosen[key] = self._base(off)
        base, node, hashes = self.chosen[key]
        for wanted in hashes:
            hit = self.index.get((off.cloud, off.region, wanted))
            if hit is not None and node is not None:
                from gpucloud.plan.baked import baked_row

                return baked_row(hit, self._stack(off), node)
        return base

    def _stack(self, off: Offering) -> Stack:
        stack = self.stacks.of(off.gpu)
        assert not isinstance(stack, str), "rows whose stack does not resolve are excluded before"
        return stack

    def _base(self, off: Offering) -> tuple[Image | None, NodeStack | None, tuple[str, ...]]:
        from gpucloud.plan.baked import stack_hash
        from gpucloud.plan.images import choose_image, cpu_arch_of, resolve_node

        arch = cpu_arch_of(off)
        stack = self._stack(off)
        base = choose_image(stack, off.cloud, off.instance_type, off.gpu_count, arch, self.job_image)
        if not any(cloud == off.cloud for cloud, _, _ in self.index):
            return base, None, ()
        node = resolve_node(stack, off.cloud, off.instance_type, off.gpu_count, cpu_arch=arch, chosen=base)
        return base, node, (stack_hash(stack, node, self.setup), stack_hash(stack, node))
