"""The CPUs and memory each node of a Slurm job asks for besides its GPUs (`--cpus-per-task` with
one task per node, `--mem`), and which of a partition's nodes can hold them (docs/SLURM.md, "CPUs
and memory").

Why a default: a job that names no CPUs gets one core and the site's default memory (sbatch(1)),
and on a cgroup-enforced cluster its GPUs then starve on that core or it is OOM-killed. So a job
without `min_vcpus`/`min_memory_gib` asks for the node's CPUs and memory in proportion to the GPUs
it takes (2 of 8 GPUs: a quarter, at least one CPU), counted on the smallest of the nodes that
could run it, so that every one of them still can; a CPU job keeps the site's defaults. What the
job sets is asked for as set, and nodes that cannot hold it do not count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpucloud.contract.provider import PlanRequest
from gpucloud.providers.slurm.cluster import Partition

MB_PER_GIB = 1024  # Slurm's memory unit is the MB of 2**20 bytes


@dataclass(frozen=True)
class Size:
    """What one node of the job asks for; 0 leaves that to the site's default."""

    cpus: int = 0
    memory_mb: int = 0
    derived: bool = False  # the proportional default, not the job's own min_vcpus/min_memory_gib

    def describe(self) -> str:
        parts = [f"{self.cpus} CPU(s)"] if self.cpus else []
        parts += [memory_text(self.memory_mb)] if self.memory_mb else []
        return " and ".join(parts) or "the site's default CPUs and memory"

    @property
    def memory_gib(self) -> float:
        return self.memory_mb / MB_PER_GIB

    @staticmethod
    def of(cpus: int, memory_gib: float) -> Size:
        """A launch request's values back as a Size (the plan's figures, carried by the candidate)."""
        return Size(cpus=max(0, cpus), memory_mb=max(0, round(memory_gib * MB_PER_GIB)))


def memory_text(mb: int) -> str:
    return f"{mb // MB_PER_GIB} GiB memory" if mb % MB_PER_GIB == 0 else f"{mb} MB memory"


def wanted(job: PlanRequest, part: Partition, nodes: list[str]) -> Size:
    """The job's own min_vcpus/min_memory_gib; what it leaves out, for a GPU job, the share of the
    smallest of `nodes` (those with the job's GPUs) that its GPUs are of that node's GPUs."""
    cpus = job.min_vcpus
    memory_mb = math.ceil(job.min_memory_gib * MB_PER_GIB) if job.min_memory_gib else 0
    derived = False
    if job.gpu and job.gpu_count:
        gpus = {n: sum(part.nodes.get(n, {}).values()) for n in nodes}
        gpus = {n: total for n, total in gpus.items() if total >= job.gpu_count}
        cpu_shares = [part.cpus[n] * job.gpu_count // total for n, total in gpus.items() if n in part.cpus]
        mem_shares = [part.memory_mb[n] * job.gpu_count // total for n, total in gpus.items() if n in part.memory_mb]
        if not cpus and cpu_shares:
            cpus, derived = max(1, min(cpu_shares)), True
        if not memory_mb and mem_shares and min(mem_shares) > 0:
            memory_mb, derived = min(mem_shares), True
    return Size(cpus=cpus, memory_mb=memory_mb, derived=derived)


def holds(part: Partition, node: str, size: Size) -> bool:
    """The node has the CPUs and memory (a figure sinfo did not give is Slurm's to judge)."""
    cpus_ok = not size.cpus or node not in part.cpus or part.cpus[node] >= size.cpus
    return cpus_ok and (not size.memory_mb or node not in part.memory_mb or part.memory_mb[node] >= size.memory_mb)
