"""The job file: pydantic v2 models (JobSpec and friends) and YAML loading with line-aware errors.

OWNER: spec helper. The model attributes below are a contract used by planner, render and lifecycle;
keep their names and types. Validators, GPU-name resolution, the loader and the error formatting
are to be completed here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CloudName = Literal["aws", "azure", "local"]
FrameworkName = Literal["pytorch", "tensorflow", "none"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class GpuRequest(_Strict):
    """`MODEL:COUNT` per node; `model` is the catalog's canonical name (e.g. "A100-80GB")."""

    model: str
    count: int = Field(1, ge=1, le=16)


class Resources(_Strict):
    cloud: list[CloudName] = Field(default_factory=lambda: ["aws", "azure"])  # "any" = aws + azure
    regions: list[str] | None = None
    gpu: GpuRequest | None = None
    instance_type: str | None = None
    spot: bool | Literal["auto"] = False
    max_price_per_hour: float | None = Field(None, gt=0)
    min_vcpus: int | None = Field(None, ge=1)
    min_memory_gib: float | None = Field(None, gt=0)
    disk_gb: int = Field(100, ge=20, le=16384)
    ssh: bool = False


class StackSpec(_Strict):
    driver: str = "auto"
    cuda: str = "auto"
    cudnn: str = "auto"
    framework: FrameworkName = "none"
    framework_version: str = "auto"


class JobSpec(_Strict):
    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
    resources: Resources = Field(default_factory=Resources)
    num_nodes: int = Field(1, ge=1, le=64)
    stack: StackSpec = Field(default_factory=StackSpec)
    image: str = "auto"
    workdir: str = "."
    env: dict[str, str] = Field(default_factory=dict)
    setup: str | None = None
    run: str
    artifacts: list[str] = Field(default_factory=list)
    max_duration: int = Field(6 * 3600, ge=60, le=30 * 86400)  # seconds; input "90m" / "6h" / "2d"
    source: Path | None = Field(None, exclude=True)  # the job file it came from (not part of the format)

    def workdir_path(self) -> Path:
        """workdir is relative to the job file's folder (like docker-compose), else to the cwd."""
        base = self.source.parent if self.source else Path.cwd()
        return (base / self.workdir).resolve()
