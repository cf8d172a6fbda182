"""Turning pydantic's validation errors into SpecIssues: one line per problem naming the file,
line, dotted field, what is wrong and what was expected (with "did you mean" for unknown keys)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from gpucloud.spec.models import GpuRequest, JobSpec, Resources, StackSpec
from gpucloud.spec.values import SpecIssue, describe, did_you_mean

# Field hints: appended to pydantic's own type/bound errors so each says what belongs there.
FIELD_HINTS: dict[str, str] = {
    "name": "a job name of lowercase letters, digits and dashes, e.g. mnist-k80",
    "run": "the shell command that runs the job, e.g. run: python train.py",
    "setup": "a shell command run once before run, e.g. pip install -r requirements.txt",
    "workdir": "a folder to upload, relative to the job file, e.g. .",
    "image": "auto, an AMI id or an Azure image URN",
    "num_nodes": "a whole number of nodes from 1 to 64",
    "env": "a mapping of NAME: value, e.g. {EPOCHS: 5}",
    "artifacts": "a list of relative paths, e.g. [outputs/, metrics.json]",
    "ports": "a list of the node's TCP ports to forward, e.g. [6006, 8888]",
    "max_duration": "a duration such as 90m, 6h or 2d",
    "max_cost": "the most the whole run may cost, in USD, greater than 0, e.g. 25",
    "keep": "an idle time such as 30m (the machine waits that long for the next job), or off",
    "resources": "a mapping with gpu, cloud, regions, spot, ...",
    "resources.gpu": "MODEL:COUNT such as T4:1, or a mapping {model: T4, count: 1}, or a list of them",
    "resources.gpu.model": "a GPU model such as T4, L4 or A100-80GB",
    "resources.gpu.count": "GPUs per node, a whole number from 1 to 16",
    "resources.gpu.max_count": "the most GPUs per node, a whole number from 1 to 16",
    "resources.gpu.memory": "GPU memory per GPU such as 24GB.., 24GB..80GB or ..48GB",
    "resources.gpu.other_models": "a list of GPU models such as [A10G, L4]",
    "resources.gpu_options": "a list of GPU requests, any of which will do (the same as a list under gpu)",
    "resources.gpu_order": "cheapest (the cheapest fitting offering first) or ordered (the gpu list's order first)",
    "resources.instance_type": "an instance type such as g4dn.xlarge or Standard_NC4as_T4_v3",
    "resources.max_price_per_hour": "a price in USD per node-hour, greater than 0, e.g. 2.5",
    "resources.min_vcpus": "a whole number of vCPUs, at least 1",
    "resources.min_memory_gib": "memory in GiB, greater than 0",
    "resources.disk_gb": "the disk size in GB, a whole number from 20 to 16384",
    "resources.ssh": "true or false",
    "resources.arch": "the host CPU: x86_64 (the default), arm64 (AWS Graviton g5g, T4G) or any",
    "resources.idle_timeout": "a duration such as 10m (every GPU idle that long ends the run), or off",
    "stack": "a mapping with driver, cuda, cudnn and framework",
}
_TYPE_WORDS: dict[str, str] = {
    "string_type": "text",
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}
# Section models by YAML path, for "unknown key" suggestions.
_SECTIONS: dict[tuple[str, ...], type[BaseModel]] = {
    (): JobSpec,
    ("resources",): Resources,
    ("resources", "gpu"): GpuRequest,
    ("stack",): StackSpec,
}
INPUT_ONLY_FIELDS = {"source"}  # model fields that are not part of the file format
# Derived fields whose value comes from another key in the file.
_LOC_ALIASES = {("stack", "framework_version"): ("stack", "framework")}


def _known_keys(path: tuple[str | int, ...]) -> list[str]:
    model = _SECTIONS.get(tuple(str(p) for p in path))
    return [k for k in model.model_fields if k not in INPUT_ONLY_FIELDS] if model else []


def unknown_key_message(key: Any, parent: tuple[str | int, ...]) -> str:
    """'unknown key' with the level where a key of exactly that name belongs (a misplaced key is
    likelier than a typo: `spot:` at the top is `resources.spot`, not `ports`), else the closest key
    at this level, else the closest key elsewhere."""
    word = str(key)
    known = _known_keys(parent)
    from gpucloud.spec.peer_keys import peer_key_message  # a failing file only

    peer = peer_key_message(word, known)
    if peer:
        return peer
    elsewhere = {".".join((*p, k)): k for p, m in _SECTIONS.items() if p != parent for k in _known_keys(p)}
    norm = word.lower().replace("-", "_")
    close_full = next((full for full, k in elsewhere.items() if k == norm), None)
    close = did_you_mean(word, known) if close_full is None else None
    if close:
        return f"unknown key '{word}'. Did you mean '{close}'?"
    if close_full is None:
        close_key = did_you_mean(word, list(set(elsewhere.values())), cutoff=0.8)
        close_full = next((f for f, k in elsewhere.items() if k == close_key), None) if close_key else None
    if close_full:
        section = close_full.rsplit(".", 1)[0] if "." in close_full else "the top level"
        return f"unknown key '{word}' here. Did you mean '{close_full}'? It belongs under {section}"
    return f"unknown key '{word}'. Known keys here: {', '.join(known)}"


def dotted_path(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _hint_key(loc: tuple[str | int, ...]) -> str:
    return ".".join(str(p) for p in loc if not isinstance(p, int))


def _explain(err: Mapping[str, Any], loc: tuple[str | int, ...]) -> str:
    """Pydantic's error as '<what is wrong>. <what was expected>'."""
    kind: str = err["type"]
    ctx: dict[str, Any] = err.get("ctx") or {}
    value = err.get("input")
    hint = FIELD_HINTS.get(_hint_key(loc))
    expected = f" Expected {hint}." if hint else ""
    if kind == "spec":
        text = str(ctx["msg"])
        return text if text.endswith((".", "?")) else text + "."
    if kind == "missing":
        return f"required key '{loc[-1]}' is missing.{expected}".rstrip(".") + "."
    if kind == "extra_forbidden":
        text = unknown_key_message(loc[-1], loc[:-1])
        return text if text.endswith("?") else text + "."
    if kind in _TYPE_WORDS:
        want = hint or _TYPE_WORDS[kind]
        if value is None:
            return f"has no value. Expected {want}."
        quote = " Quote the value if it is meant as text." if kind == "string_type" else ""
        return f"expected {want}, got {describe(value)}.{quote}"
    bounds = {
        "greater_than_equal": ("must be at least", "ge"),
        "greater_than": ("must be greater than", "gt"),
        "less_than_equal": ("must be at most", "le"),
        "less_than": ("must be less than", "lt"),
    }
    if kind in bounds:
        words, key = bounds[kind]
        limit = ctx.get(key)
        if isinstance(limit, float) and limit.is_integer():
            limit = int(limit)
        return f"{words} {limit}, got {value}.{expected}"
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        close = did_you_mean(str(value), choices) if isinstance(value, str) else None
        mean = f" Did you mean '{close}'?" if close else ""
        return f"{describe(value)} is not allowed.{mean} Expected one of {', '.join(choices)}."
    msg = str(err.get("msg", "invalid value")).rstrip(".")
    return f"{msg[:1].lower()}{msg[1:]}, got {describe(value)}.{expected}"


@dataclass(frozen=True)
class KeyLines:
    key_line: int
    value_line: int
    scalar: bool


def _line_for(
    loc: tuple[Any, ...], kind: str, on_key: bool, lines: dict[tuple[Any, ...], KeyLines], root_line: int
) -> int:
    """The line of the offending key (unknown/bad keys) or value; for a missing key the parent's."""
    path = tuple(loc)
    if kind == "missing":
        path, on_key = path[:-1], True
    path = _LOC_ALIASES.get(path, path) if path not in lines else path
    exact = True
    while path and path not in lines:
        path, exact = path[:-1], False
    if not path:
        return root_line
    where = lines[path]
    # A scalar's own line unless the key itself is at fault; a mapping or list: the line of its key.
    return where.key_line if (on_key and exact) or not where.scalar else where.value_line


def _as_written(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """`gpu: [..]` is validated as `gpu_options`: report its items where the file has them."""
    if loc[:2] == ("resources", "gpu_options"):
        return ("resources", "gpu", *loc[2:])
    return loc


def issues_from(
    exc: ValidationError, filename: str, lines: dict[tuple[Any, ...], KeyLines], root_line: int
) -> list[SpecIssue]:
    issues: list[SpecIssue] = []
    for err in exc.errors():
        raw = tuple(err["loc"])
        on_key = "[key]" in raw or err["type"] == "extra_forbidden"
        sub = tuple((err.get("ctx") or {}).get("sub", ())) if err["type"] == "spec" else ()
        loc = _as_written(tuple(p for p in raw if p != "[key]") + sub)
        line = _line_for(loc, err["type"], on_key, lines, root_line)
        issues.append(SpecIssue(filename, line, dotted_path(loc), _explain(err, loc)))
    return issues
