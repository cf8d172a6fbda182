"""Cost-aware ranking of candidates, with a reason for every exclusion. OWNER: lead (types are a contract)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpucloud.catalog.models import Offering
    from gpucloud.spec import JobSpec
    from gpucloud.stacks import Stack


@dataclass(frozen=True)
class Candidate:
    cloud: str                 # "aws" | "azure" | "local"
    region: str                # "local" for the local provider
    instance_type: str         # "localhost" for the local provider
    gpu: str                   # canonical GPU name, "" when the job asked for none
    gpu_count: int             # per node
    num_nodes: int
    spot: bool
    price_per_hour: float      # per node
    total_per_hour: float      # price_per_hour * num_nodes
    estimated_cost: float      # total_per_hour * max_duration hours
    status: str = "active"     # offering status ("legacy" candidates carry a warning)
    vcpus: int = 0
    memory_gib: float = 0.0

    def as_json(self) -> dict[str, object]:
        return {
            "cloud": self.cloud, "region": self.region, "instance_type": self.instance_type,
            "gpu": self.gpu, "gpu_count": self.gpu_count, "num_nodes": self.num_nodes,
            "spot": self.spot, "price_per_hour": self.price_per_hour,
            "total_per_hour": self.total_per_hour, "estimated_cost": self.estimated_cost,
        }


@dataclass(frozen=True)
class Exclusion:
    cloud: str
    region: str
    instance_type: str
    reason: str

    def as_json(self) -> dict[str, str]:
        return {"cloud": self.cloud, "region": self.region, "instance_type": self.instance_type, "reason": self.reason}


@dataclass
class Plan:
    spec: JobSpec
    candidates: list[Candidate]   # cheapest first = the failover order of `run`
    excluded: list[Exclusion]
    stack: Stack
    warnings: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {
            "candidates": [c.as_json() for c in self.candidates],
            "excluded": [e.as_json() for e in self.excluded],
            "stack": self.stack.as_json(),
            "warnings": list(self.warnings),
        }
