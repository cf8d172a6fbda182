"""`resources.gpu`: one GPU request or a list of alternatives, with model choices and ranges.

Why its own module: the friendly forms (`T4:1`, `A100|H100:8`, `L4:1..2`, `{memory: 24GB.., count:
1..4}`, a list of any of these) all end in one `GpuRequest` type, and the planner (plan/match.py)
asks it what its memory range takes, so that the spec and the planner cannot disagree on what a range means.
Ranges are inclusive; a count is exact unless written as a range; memory is per GPU as the catalog
counts it (an A10G has 24, an A100-80GB 80), and a single memory figure is a minimum (more memory
never hurts a job)."""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from gpucloud.spec.values import describe, refuse_bool, reject, required_text, resolve_gpu

MAX_GPU_COUNT = 16
_COUNT_RE = re.compile(r"^\s*([0-9]*)\s*\.\.\s*([0-9]*)\s*$")
_MEMORY_RE = re.compile(
    r"^\s*(?:([0-9]+(?:\.[0-9]+)?)\s*(GB|GIB|G)?)?\s*(\.\.)?\s*(?:([0-9]+(?:\.[0-9]+)?)\s*(GB|GIB|G)?)?\s*$"
)
EXPECTED = (
    "MODEL:COUNT such as T4:1 or A100-80GB:8, A100|H100:8, L4:1..2, a mapping {model: T4, count: 1} or "
    "{memory: 24GB.., count: 1..4}, or a list of these (any of them)"
)


class GpuRequest(BaseModel):
    """`MODEL:COUNT` per node; `model` is the catalog's canonical name (e.g. "A100-80GB"), "" when
    only memory is asked for. `other_models` are further models accepted (`A100|H100`); `max_count`
    makes `count` the least of a range; `memory` is (least, most or None) GiB per GPU."""

    model_config = ConfigDict(extra="forbid")

    model: str
    count: int = Field(1, ge=1, le=MAX_GPU_COUNT)
    max_count: int | None = Field(None, ge=1, le=MAX_GPU_COUNT)
    other_models: list[str] = Field(default_factory=list)
    memory: tuple[float, float | None] | None = None

    @model_validator(mode="before")
    @classmethod
    def _forms(cls, data: Any) -> Any:
        """`model: A100|H100` or a list of models, and `count: 1..4`, into the stored fields."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        model = data.get("model")
        if isinstance(model, list) or (isinstance(model, str) and "|" in model):
            names = model if isinstance(model, list) else model.split("|")
            if not names or not all(isinstance(n, str) and n.strip() for n in names):
                reject(f"{describe(model)} names no GPU model. Expected e.g. A100|H100 or [A100, H100]", "model")
            data["model"] = names[0].strip()
            data["other_models"] = [n.strip() for n in names[1:]] + list(data.get("other_models") or [])
        count = data.get("count")
        if isinstance(count, str) and ".." in count:
            found = _COUNT_RE.fullmatch(count)
            if not found:
                reject(f"'{count}' is not a count range. Expected e.g. 1..4, 2.. or ..8", "count")
            low, high = found.group(1), found.group(2)
            data["count"] = int(low) if low else 1
            data["max_count"] = int(high) if high else MAX_GPU_COUNT
        if "model" not in data and data.get("memory") is not None:
            data["model"] = ""
        return data

    @field_validator("model", mode="before", json_schema_input_type=str | list[str])
    @classmethod
    def _model(cls, value: Any) -> str:
        if value == "":
            return ""
        return resolve_gpu(required_text(value, "a GPU model such as T4, L4 or A100-80GB"))

    @field_validator("other_models", mode="before", json_schema_input_type=list[str])
    @classmethod
    def _other_models(cls, value: Any) -> list[str]:
        if not isinstance(value, list):
            reject(f"expected a list of GPU models, got {describe(value)}")
        out: list[str] = []
        for i, item in enumerate(value):
            try:
                name = resolve_gpu(required_text(item, "a GPU model such as T4, L4 or A100-80GB"))
            except PydanticCustomError as exc:
                reject(str((exc.context or {}).get("msg", exc)), i)
            if name not in out:
                out.append(name)
        return out

    @field_validator("count", "max_count", mode="before", json_schema_input_type=int | str | None)
    @classmethod
    def _count(cls, value: Any) -> Any:
        return refuse_bool(value)

    @field_validator("memory", mode="before", json_schema_input_type=str | int | float | list[float | None] | None)
    @classmethod
    def _memory(cls, value: Any) -> tuple[float, float | None] | None:
        return parse_memory(value)

    @model_validator(mode="after")
    def _consistent(self) -> GpuRequest:
        if self.max_count is not None and self.max_count < self.count:
            reject(f"the range {self.count}..{self.max_count} is empty: the least is above the most", "count")
        if self.max_count == self.count:
            self.max_count = None
        if not self.model and self.memory is None:
            reject("names no GPU model and no memory. Expected a model (T4) or memory (24GB..)", "model")
        self.other_models = [m for m in self.other_models if m != self.model]
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A plain `T4:1` dumps as {model, count}, as before ranges existed."""
        doc: dict[str, Any] = handler(self)
        for key in ("max_count", "memory"):
            if doc.get(key) is None:
                doc.pop(key, None)
        if not doc.get("other_models"):
            doc.pop("other_models", None)
        return doc

    @property
    def models(self) -> tuple[str, ...]:
        """Every model named (empty: any model with the memory asked for)."""
        return (self.model, *self.other_models) if self.model else ()

    @property
    def most(self) -> int:
        return self.max_count if self.max_count is not None else self.count

    def takes_memory(self, gpu_memory_gib: float) -> bool:
        """Is a GPU with this much memory each (GiB, as the catalog counts it) in the request's range?"""
        if self.memory is None:
            return True
        low, high = self.memory
        return low <= gpu_memory_gib and (high is None or gpu_memory_gib <= high)

    def label(self) -> str:
        """The request as a user would write it (`plan` shows which one each candidate meets)."""
        text = "|".join(self.models) or "any"
        if self.memory is not None:
            low, high = self.memory
            text += f"({_gib(low) if low else ''}..{_gib(high) if high is not None else ''})"
        counts = f"{self.count}..{self.max_count}" if self.max_count is not None else str(self.count)
        return f"{text}:{counts}"


def _gib(value: float) -> str:
    return f"{value:g}GB"


def _memory_pair(value: list[Any] | tuple[Any, ...]) -> tuple[float, float | None]:
    """The stored form [least, most or null] (GiB), as `plan --json` writes it back."""
    expected = "Expected e.g. 24GB.., 24GB..80GB, or a pair [24, 80] / [24, null] of GB per GPU"
    if len(value) != 2:
        reject(f"a list of {len(value)} item(s) is not a GPU memory range. {expected}")
    for item in value:
        if item is not None and (isinstance(item, bool) or not isinstance(item, int | float)):
            reject(f"{describe(item)} in the pair is not a number of GB. {expected}")
        if item is not None and (not math.isfinite(item) or item < 0):
            reject(f"{item} in the pair is not a size of GB. {expected}")
    low, high = float(value[0] or 0), None if value[1] is None else float(value[1])
    if high is not None and high < low:
        reject(f"the range {list(value)} is empty: the least is above the most")
    return (low, high)


def parse_memory(value: Any) -> tuple[float, float | None] | None:
    """`24GB..`, `24GB..80GB`, `..48GB`, `24` (GiB; a single figure is a minimum), or a stored pair."""
    if value is None:
        return None
    if isinstance(value, list | tuple):
        return _memory_pair(value)
    if isinstance(value, bool):
        reject(f"expected GPU memory such as 24GB.., got {describe(value)}")
    if isinstance(value, int | float):
        if not value > 0 or not math.isfinite(value):
            reject(f"GPU memory must be a number above 0, got {value}. Expected e.g. 24GB..")
        return (float(value), None)
    text = required_text(value, "GPU memory per GPU such as 24GB.., 24GB..80GB or ..48GB").upper()
    found = _MEMORY_RE.fullmatch(text)
    if not found or not (found.group(1) or found.group(4)) or (found.group(4) and not found.group(3)):
        reject(f"'{value}' is not a GPU memory range. Expected e.g. 24GB.., 24GB..80GB or ..48GB (GB per GPU)")
    low = float(found.group(1)) if found.group(1) else 0.0
    high = float(found.group(4)) if found.group(4) else None
    if high is not None and high < low:
        reject(f"the range '{value}' is empty: the least is above the most")
    return (low, high)


def gpu_input(value: Any, *sub: str | int) -> Any:
    """One request in a friendly form -> GpuRequest's input mapping ("K80:1" -> {model, count});
    mappings go on as they are. `sub` places an error at a list item."""
    if isinstance(value, dict) and len(value) == 1:
        ((key, count),) = value.items()
        if key not in GpuRequest.model_fields:
            from gpucloud import catalog
            from gpucloud.spec.values import did_you_mean

            if did_you_mean(str(key), list(GpuRequest.model_fields)) is None and catalog.resolve_gpu_name(str(key)):
                reject(
                    f"'{key}: {count}' reads as a mapping because of the space after the colon. "
                    f"Write {key}:{count} (no space), or a mapping {{model: {key}, count: {count}}}",
                    *sub,
                )
    if value is None or isinstance(value, dict | GpuRequest):
        return value
    if not isinstance(value, str):
        reject(f"expected {EXPECTED}, got {describe(value)}", *sub)
    model, sep, count = value.strip().rpartition(":")
    if not sep:
        model, count = count, "1"
    model, count = model.strip(), count.strip()
    if not model:
        reject(f"'{value}' names no GPU model. Expected {EXPECTED}", *sub)
    if ".." in count:
        return {"model": model, "count": count}
    if not re.fullmatch(r"[+-]?\d+", count):
        reject(f"the GPU count '{count}' in '{value}' is not a whole number. Expected {EXPECTED}", *sub)
    return {"model": model, "count": int(count)}


def gpu_list_input(data: Any) -> Any:
    """`gpu: [L4:1, A10G:1]` (a Resources mapping): every item goes to `gpu_options`, and `gpu`
    is set to the first after validation, so each item's errors point at its own line."""
    if not isinstance(data, dict) or not isinstance(data.get("gpu"), list):
        return data
    items = data["gpu"]
    if not items:
        reject("the list is empty. Name at least one GPU request, e.g. [L4:1, A10G:1], or remove the key", "gpu")
    out = {k: v for k, v in data.items() if k != "gpu"}
    out["gpu_options"] = [gpu_input(item, "gpu", i) for i, item in enumerate(items)]
    return out
