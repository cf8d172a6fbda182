"""Catalog row types. `GpuModel` is a frozen dataclass; `Offering` is a NamedTuple because a
refreshed catalog holds tens of thousands of rows and `plan` must load them in a few tens of ms:
building a NamedTuple from a stored tuple costs a fraction of a frozen dataclass's __init__
(bench/bench_plan_rows.py). Both are immutable and read by attribute."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

Status = Literal["active", "legacy", "retired"]
# What `status_date` is: the date the cloud announced for the status ("announced": a real retirement
# date), or the day the cloud's own data was read and showed the status ("observed": for a retired
# row, the type was simply no longer listed, and no end date is known).
StatusBasis = Literal["announced", "observed"]


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str  # canonical, e.g. "K80", "A100-80GB"
    architecture: str  # "Kepler", "Maxwell", "Pascal", "Volta", "Turing", "Ampere", "Ada", "Hopper", "Blackwell"
    compute_capability: str  # "3.7"
    memory_gib: float  # per GPU as the cloud counts it (K80: 12, one GK210)
    fp32_tflops: float | None
    fp64_tflops: float | None
    bandwidth_gbs: float | None
    aliases: tuple[str, ...]  # other accepted spellings, matched case-insensitively
    source: str


class Offering(NamedTuple):
    cloud: str  # a priced provider's registry name
    instance_type: str
    gpu: str  # canonical GPU name
    gpu_count: int
    vcpus: int
    memory_gib: float
    arch: str  # CPU architecture of the host: "x86_64" | "arm64" (g5g, GB200 hosts)
    region: str
    price_per_hour: float  # on-demand, USD
    spot_price_per_hour: float | None  # None: no observed spot figure (unknown), never guessed
    status: Status
    status_date: str  # ISO date: announced for the status, or the day the data was read (status_basis)
    status_basis: StatusBasis  # "announced" | "observed": which of the two status_date is
    source: str  # where the row's facts come from ("[S" sourced, "[estimate:" marked)
    price_date: str  # ISO date (or date-time for refreshed rows) the price was read

    @property
    def withdrawn(self) -> bool:
        """A retired row whose cloud announced no end date: its current API simply no longer lists the
        type, and `status_date` is the day that was read, not a retirement date (status_basis)."""
        return self.status == "retired" and self.status_basis == "observed"

    def status_text(self) -> str:
        """The status as `catalog` and `plan` print it: the announced date, or what was observed when."""
        if self.status == "active":
            return "active"
        if self.withdrawn:
            return f"not offered as of {self.status_date}"
        if self.status_basis == "observed":
            return f"{self.status} as of {self.status_date}"
        return f"{self.status} {self.status_date}"
