"""A dstack configuration (`.dstack.yml`, `type: task`; a `service` runs as a task) as a gpucloud
job: name, commands (one script), image (container:), env, resources (gpu in every dstack form,
disk, cpu, memory), spot_policy, max_duration, nodes, backends and regions. What has no equivalent
is noted with what to do instead (common.Draft.note); dev environments, fleets, gateways and
volumes are no jobs and are refused."""

from __future__ import annotations

import re
from typing import Any

from gpucloud.errors import UserError
from gpucloud.spec.peers.common import (
    Draft,
    env_names,
    env_text,
    gpu_model,
    gpucloud_clouds,
    job_name,
    offered_gpu,
    shown,
    size_gb,
    whole,
    with_peer_variables,
)

PEER = "a dstack configuration"
TYPES = ("task", "service", "dev-environment", "fleet", "gateway", "volume")
NODE_VARIABLES = {  # dstack's names -> gpucloud's (README, "The job's environment")
    "DSTACK_NODE_RANK": "$GPUCLOUD_NODE_RANK",
    "DSTACK_NODES_NUM": "$GPUCLOUD_NUM_NODES",
    "DSTACK_GPUS_PER_NODE": "$GPUCLOUD_NUM_GPUS_PER_NODE",
    "DSTACK_GPUS_NUM": "$((GPUCLOUD_NUM_NODES * GPUCLOUD_NUM_GPUS_PER_NODE))",
    "DSTACK_MASTER_NODE_IP": "$MASTER_ADDR",
    "DSTACK_NODES_IPS": "$GPUCLOUD_NODE_IPS",
    "DSTACK_RUN_NAME": "$GPUCLOUD_RUN_ID",
}
VENDORS = ("nvidia", "amd", "google", "tpu", "intel", "tenstorrent")
_COUNT = re.compile(r"^\s*[0-9]*\s*(\.\.\s*[0-9]*)?\s*$")
_MEMORY = re.compile(r"^\s*([0-9.]+\s*[KMGT]i?B)?\s*(\.\.)?\s*([0-9.]+\s*[KMGT]i?B)?\s*$", re.IGNORECASE)
_ANY_GPU = "1GB.."  # dstack's `gpu: 1..8` (any model): every GPU has at least this much memory


def looks_like(data: dict[str, Any]) -> bool:
    """Whether the mapping is a dstack configuration: its `type`, or `commands` where a job has `run`."""
    kind = data.get("type")
    return (isinstance(kind, str) and kind.strip() in TYPES) or ("commands" in data and "run" not in data)


def convert(data: dict[str, Any], draft: Draft) -> None:
    """Fill `draft` from the dstack configuration `data`; UserError for a type that is no job."""
    rest = dict(data)
    kind = str(rest.pop("type", "task")).strip()
    if kind not in ("task", "service"):
        raise UserError(
            f"{draft.filename}: is a dstack {shown(kind)} configuration, which is no job gpucloud can run.",
            hint="gpucloud import converts dstack tasks (type: task) and services; a dev environment's "
            "commands can go in a task's commands first.",
        )
    if kind == "service":
        draft.note(
            "type",
            "service: gpucloud runs it as a job that ends when its commands end (no gateway, "
            "no replicas, no public URL).",
        )
    draft.job["name"] = job_name(rest.pop("name", None), draft.filename, draft)
    _resources(rest.pop("resources", None), draft)
    _placement(rest, draft)
    _env(rest.pop("env", None), draft)
    if "image" in rest:
        draft.job["container"] = str(rest.pop("image")).strip()
    _scripts(rest, draft)
    _notes(rest, draft)
    draft.drop_rest(rest)


def _resources(value: Any, draft: Draft) -> None:
    rest = draft.mapping(value, "resources", "resources")
    res = draft.resources
    if "gpu" in rest:
        gpu = _gpu(rest.pop("gpu"), draft)
        if gpu is not None:
            res["gpu"] = gpu
    for key, target in (("cpu", "min_vcpus"), ("memory", "min_memory_gib"), ("disk", "disk_gb")):
        if key in rest:
            _least(rest.pop(key), key, target, draft)
    if "shm_size" in rest:
        draft.note(
            "resources.shm_size",
            f"{shown(rest.pop('shm_size'))}: a machine's /dev/shm is not limited; in a container add "
            "--shm-size=SIZE to container options (docs/CONTAINERS.md).",
            "resources",
        )
    draft.drop_rest(rest, "resources.", "resources")
    if "gpu" not in res:
        res["gpu"] = "T4:1"
        draft.say("no GPU was asked for; gpu T4:1 is a placeholder (or use cloud: local to run here).", "resources")


def _least(value: Any, key: str, target: str, draft: Draft) -> None:
    """cpu 4 / "4.." / "x86:4..8", memory and disk "32GB.." -> the range's least (gpucloud keeps minimums)."""
    text = str(value.get("min", value.get("count", "")) if isinstance(value, dict) else value)
    low = text.split(":")[-1].split("..")[0].strip()
    number = whole(low) if key == "cpu" else size_gb(low)
    if number is None:
        draft.note(f"resources.{key}", f"{shown(value)} has no least value gpucloud can use; dropped.", "resources")
        return
    if key == "disk":
        number = max(20, int(number))
    draft.resources[target] = int(number) if float(number).is_integer() else number
    if ".." in text and text.split("..")[-1].strip():
        draft.note(f"resources.{key}", f"{shown(value)}: gpucloud keeps the least; the most is dropped.", "resources")


def _gpu(value: Any, draft: Draft) -> Any:
    """Every dstack GPU form ("A100:80GB:2", "24GB..", "A10G,A100", "1..8", {name, memory, count})
    as a gpucloud request: "MODEL:COUNT" or a mapping {model, memory, count}."""
    names: list[str] = []
    memory = count = None
    if isinstance(value, int) and not isinstance(value, bool):
        count = str(value)
    elif isinstance(value, str):
        for token in (t.strip() for t in value.split(":")):
            if _MEMORY.fullmatch(token) and re.search(r"[KMGT]i?B", token, re.IGNORECASE):
                memory = token
            elif _COUNT.fullmatch(token) and token:
                count = token
            elif token.lower() not in VENDORS:
                names += [n.strip() for n in token.split(",") if n.strip()]
    elif isinstance(value, dict):
        raw = value.get("name")
        names = [str(n) for n in (raw if isinstance(raw, list) else [raw] if raw else [])]
        memory = None if value.get("memory") is None else str(value["memory"])
        count = None if value.get("count") is None else str(value["count"])
        extra = sorted(set(value) - {"name", "memory", "count", "vendor"})
        if extra:
            draft.note("resources.gpu", f"{', '.join(extra)} have no gpucloud equivalent; dropped.", "resources")
    else:
        draft.note("resources.gpu", f"{shown(value)} is not a GPU request; dropped.", "resources")
        return None
    return _request(names, memory, count, value, draft)


def _request(names: list[str], memory: str | None, count: str | None, value: Any, draft: Draft) -> Any:
    least = size_gb(memory) if memory and ".." not in memory else None  # "A100:80GB" is the A100-80GB
    sized = [(gpu_model(f"{n}-{int(least)}GB") if least else None) or gpu_model(n) for n in names]
    models = list(dict.fromkeys(m for m in sized if m))
    unknown = [n for n, m in zip(names, sized, strict=True) if m is None]
    if unknown:
        draft.note(
            "resources.gpu", f"{', '.join(map(shown, unknown))}: GPUs gpucloud does not know; dropped.", "resources"
        )
    if count is not None and ".." not in count and whole(count) is None:
        count = None
    if not models and memory is None:
        memory = _ANY_GPU
        draft.say(f"gpu {shown(value)} names no model or memory: memory {_ANY_GPU} accepts any GPU.", "resources")
    if len(models) == 1 and memory is None and (count is None or ".." not in count):
        return offered_gpu(f"{models[0]}:{count or 1}", [], draft, "resources.gpu")
    request: dict[str, Any] = {}
    if models:
        request["model"] = models if len(models) > 1 else models[0]
    if memory is not None:
        request["memory"] = re.sub(r"\s+", "", memory).upper().replace("IB", "B")
    request["count"] = count or 1
    return request


def _placement(rest: dict[str, Any], draft: Draft) -> None:
    """backends/regions/instance_types, spot_policy, max_price, max_duration, nodes."""
    res = draft.resources
    backends = rest.pop("backends", None)
    if isinstance(backends, list):
        kept = gpucloud_clouds(backends, "backends", draft)
        if kept:
            res["cloud"] = kept if len(kept) > 1 else kept[0]
    regions = rest.pop("regions", None)
    if isinstance(regions, list) and regions:
        res["regions"] = [str(r).strip().lower() for r in regions]
    types = rest.pop("instance_types", None)
    if isinstance(types, list) and types:
        res["instance_type"] = str(types[0])
        if len(types) > 1:
            draft.note("instance_types", "gpucloud takes one instance_type; kept the first.", "resources")
    policy = rest.pop("spot_policy", None)
    if policy is not None:
        words = {"spot": True, "on-demand": False, "auto": "auto"}
        if str(policy) in words:
            res["spot"] = words[str(policy)]
        else:
            draft.note("spot_policy", f"{shown(policy)} is not spot, on-demand or auto; dropped.", "resources")
    if "max_price" in rest:
        res["max_price_per_hour"] = rest.pop("max_price")
    _duration(rest.pop("max_duration", None), draft)
    nodes = rest.pop("nodes", None)
    if nodes is not None:
        count = whole(nodes)
        if count:
            draft.job["num_nodes"] = count
        else:
            draft.note("nodes", f"{shown(nodes)} is not a node count; left at 1.", "num_nodes")


def _duration(value: Any, draft: Draft) -> None:
    if value is None:
        return
    if str(value).strip().lower() in ("off", "false"):
        draft.note("max_duration", "off: every gpucloud job has a deadline; the longest is 30d.", "max_duration")
        draft.job["max_duration"] = "30d"
    elif isinstance(value, int) and not isinstance(value, bool):
        draft.job["max_duration"] = value
    else:
        draft.job["max_duration"] = str(value).strip()


def _env(value: Any, draft: Draft) -> None:
    """`env: [A=1, HF_TOKEN]` or a mapping: K=V -> env; a bare name (dstack takes its value from
    your environment) -> secrets."""
    pairs: list[tuple[Any, Any]] = []
    if isinstance(value, list):
        pairs = [tuple(str(i).split("=", 1)) if "=" in str(i) else (str(i), None) for i in value]  # type: ignore[misc]
    elif isinstance(value, dict):
        pairs = list(value.items())
    elif value is not None:
        draft.note("env", f"{shown(value)} is not a list or mapping; dropped.", "env")
    good = set(env_names([k for k, _ in pairs], "env", draft))
    env = {k: env_text(v) for k, v in pairs if k in good and v is not None}
    names = [k for k, v in pairs if k in good and v is None and k not in env]
    if env:
        draft.job["env"] = env
    if names:
        draft.job["secrets"] = list(dict.fromkeys(names))
        draft.say(
            f"{', '.join(names)} had no value in env (dstack reads it from your environment): now secrets, "
            "whose values come from your environment, --secret or --secret-file.",
            "secrets",
        )


def _scripts(rest: dict[str, Any], draft: Draft) -> None:
    """setup and commands, each list one script that stops at the first failing command (as dstack's)."""
    for key, target in (("setup", "setup"), ("commands", "run")):
        value = rest.pop(key, None)
        if value is None:
            continue
        lines = value if isinstance(value, list) else [value]
        if not all(isinstance(line, str) for line in lines):
            draft.note(key, "holds something that is not a command; dropped.", target)
            continue
        script, used = with_peer_variables("set -e\n" + "\n".join(s.rstrip("\n") for s in lines) + "\n", NODE_VARIABLES)
        draft.job[target] = script
        if used:
            draft.say(f"{', '.join(used)} set from gpucloud's variables.", target)
    if "run" not in draft.job:
        draft.job["run"] = "true"
        draft.note("commands", "the configuration has no commands; gpucloud needs a run (`true` does nothing).", "run")


def _notes(rest: dict[str, Any], draft: Draft) -> None:
    """The fields with no equivalent that a task commonly has, each with what to do instead."""
    advice = {
        "python": "gpucloud runs the machine image's python3 (or the container's): install this version in "
        "setup (uv python install), or use container: python:VERSION.",
        "ports": "no equivalent yet (gpucloud opens no ports): reach a service over SSH with "
        "resources.ssh: true and ssh -L PORT:localhost:PORT.",
        "working_dir": "the job starts in its uploaded workdir: add cd DIR at the start of run.",
        "files": "the job file's folder (workdir) is uploaded; other local files go under inputs:.",
        "repos": "the job file's folder (workdir) is uploaded; clone other repositories in setup.",
        "retry": "use recovery: {on: [preemption, capacity, lost]} (docs/SPOT.md).",
        "volumes": "use inputs:/outputs: with a bucket, or checkpoint: for state kept across attempts.",
    }
    for key, text in advice.items():
        if key in rest:
            draft.note(key, f"{shown(rest.pop(key), 40)}: {text}")
    if "python" in draft.unmapped and "uv " in str(draft.job.get("run", "")):
        draft.say("dstack's default image has uv and conda; gpucloud's has neither: install them in setup.", "run")
