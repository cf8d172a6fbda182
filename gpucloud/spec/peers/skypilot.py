"""A SkyPilot task YAML (`sky launch task.yaml`) as a gpucloud job: name, resources (accelerators,
cloud/infra, region, spot, disk, instance type, cpus/memory, docker image), num_nodes, envs,
secrets, workdir, file_mounts (buckets to inputs/outputs), setup and run. What has no equivalent
is noted with what to do instead (common.Draft.note)."""

from __future__ import annotations

from typing import Any

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

PEER = "a SkyPilot task"
# Keys only a SkyPilot task has (gpucloud's own name, resources, num_nodes, setup, run, workdir
# and secrets are shared and prove nothing).
TOP_SIGNS = frozenset({"envs", "file_mounts", "storage_mounts", "service", "event_callback", "volumes", "pool"})
RESOURCE_SIGNS = frozenset(
    {
        "accelerators",
        "infra",
        "use_spot",
        "disk_size",
        "disk_tier",
        "image_id",
        "cpus",
        "memory",
        "ports",
        "region",
        "zone",
        "any_of",
        "ordered",
        "accelerator_args",
        "labels",
        "autostop",
        "job_recovery",
        "spot_recovery",
        "network_tier",
    }
)
NODE_VARIABLES = {  # SkyPilot's names -> gpucloud's (README, "The job's environment")
    "SKYPILOT_NODE_RANK": "$GPUCLOUD_NODE_RANK",
    "SKYPILOT_NODE_IPS": "$GPUCLOUD_NODE_IPS",
    "SKYPILOT_NUM_NODES": "$GPUCLOUD_NUM_NODES",
    "SKYPILOT_NUM_GPUS_PER_NODE": "$GPUCLOUD_NUM_GPUS_PER_NODE",
    "SKYPILOT_TASK_ID": "$GPUCLOUD_RUN_ID",
    "SKYPILOT_SPOT_RUN_ID": "$GPUCLOUD_RUN_ID",
    "SKYPILOT_JOB_ID": "$GPUCLOUD_RUN_ID",
    "SKY_NODE_RANK": "$GPUCLOUD_NODE_RANK",
    "SKY_NODE_IPS": "$GPUCLOUD_NODE_IPS",
}
_PLACEHOLDER_GPU = "T4:1"


def looks_like(data: dict[str, Any]) -> bool:
    """Whether the mapping has a key only a SkyPilot task has."""
    resources = data.get("resources")
    keys = set(resources) if isinstance(resources, dict) else set()
    return bool(TOP_SIGNS & set(data) or RESOURCE_SIGNS & keys)


def convert(data: dict[str, Any], draft: Draft) -> None:
    """Fill `draft` from the SkyPilot task `data`."""
    rest = dict(data)
    draft.job["name"] = job_name(rest.pop("name", None), draft.filename, draft)
    _resources(rest.pop("resources", None), draft)
    nodes = rest.pop("num_nodes", None)
    if nodes is not None:
        count = whole(nodes)
        if count:
            draft.job["num_nodes"] = count
        else:
            draft.note("num_nodes", f"{shown(nodes)} is not a node count; left at 1.")
    _envs(rest.pop("envs", None), rest.pop("secrets", None), draft)
    _workdir(rest.pop("workdir", None), draft)
    for field in ("file_mounts", "storage_mounts"):
        _file_mounts(rest.pop(field, None), field, draft)
    _scripts(rest.pop("setup", None), rest.pop("run", None), draft)
    draft.drop_rest(rest)


# ---------------------------------------------------------------------------------------------
# resources


def _resources(value: Any, draft: Draft) -> None:
    rest = draft.mapping(value, "resources", "resources")
    res = draft.resources
    _where(rest.pop("infra", None), rest.pop("cloud", None), rest.pop("region", None), draft)
    _accelerators(rest.pop("accelerators", None), rest.pop("any_of", None), rest.pop("ordered", None), draft)
    _machine(rest, draft)
    spot = rest.pop("use_spot", None)
    if spot is not None:
        res["spot"] = spot if isinstance(spot, bool) else str(spot)
    for key in ("spot_recovery", "job_recovery"):
        if key in rest:
            draft.job["recovery"] = True
            draft.note(
                f"resources.{key}",
                f"{shown(rest.pop(key), 40)}: gpucloud's recovery: relaunches after a preemption (up to 3 "
                "times; add capacity and lost to `on:` for more, docs/SPOT.md); keep a checkpoint: folder.",
                "recovery",
            )
    if "ports" in rest:
        draft.note(
            "resources.ports",
            f"{shown(rest.pop('ports'))}: no equivalent yet (gpucloud opens no ports). Reach a service over "
            "SSH: resources.ssh: true, then ssh -L PORT:localhost:PORT to the machine.",
            "resources",
        )
    if "image_id" in rest:
        _image(rest.pop("image_id"), draft)
    draft.drop_rest(rest, "resources.", "resources")
    if "gpu" not in res and "instance_type" not in res:
        res["gpu"] = _PLACEHOLDER_GPU
        draft.say(
            f"the task asks for no accelerator, but gpucloud plans a cloud machine from a GPU or an "
            f"instance_type: gpu {_PLACEHOLDER_GPU} is a placeholder (or use cloud: local to run here).",
            "resources",
        )


def _gpu(text: Any, field: str, draft: Draft) -> str | None:
    """ "V100" / "V100:4" / ("A100", 8) -> "MODEL:COUNT", or None (noted) when gpucloud has no such GPU."""
    if isinstance(text, tuple):
        name, count = text
    else:
        name, _, count = str(text).partition(":")
    model = gpu_model(str(name))
    if model is None:
        draft.note(field, f"{shown(name)} is a GPU gpucloud does not know (`gpucloud gpus` lists them); dropped.")
        return None
    number = 1 if count in ("", None) else whole(count)
    if number is None or str(count).strip() not in ("", str(number)):
        draft.note(field, f"{shown(text)}: gpucloud gives whole GPUs; asked for {number or 1}.", "resources")
    return f"{model}:{number or 1}"


def _accelerators(value: Any, any_of: Any, ordered: Any, draft: Draft) -> None:
    items: list[Any] = []
    if isinstance(value, str | int | float) and value != "":
        items = [str(value)]
    elif isinstance(value, dict):  # {A100: 8} or {V100, A100:2} (a flow set reads as keys with no value)
        items = [(str(k), v) if v is not None else str(k) for k, v in value.items()]
    elif isinstance(value, list | set):
        items = list(value)
    for alternatives, field in ((any_of, "resources.any_of"), (ordered, "resources.ordered")):
        if isinstance(alternatives, list):
            for alt in alternatives:
                if isinstance(alt, dict) and alt.get("accelerators") is not None:
                    items.append(str(alt["accelerators"]))
                others = sorted(set(alt) - {"accelerators"}) if isinstance(alt, dict) else []
                if others:
                    draft.note(field, f"only each entry's accelerators are kept ({', '.join(others)} dropped).")
        elif alternatives is not None:
            draft.note(field, f"{shown(alternatives)} is not a list; dropped.")
    gpus = [g for g in (_gpu(i, "resources.accelerators", draft) for i in items) if g]
    gpus = list(dict.fromkeys(gpus))
    if len(gpus) == 1:  # alternatives: the plan picks among them and says which are sold
        clouds = draft.resources.get("cloud", [])
        gpus = [offered_gpu(gpus[0], [clouds] if isinstance(clouds, str) else clouds, draft, "resources.accelerators")]
    if len(gpus) == 1:
        draft.resources["gpu"] = gpus[0]
    elif gpus:
        draft.resources["gpu"] = gpus
        if ordered is not None:
            draft.resources["gpu_order"] = "ordered"


def _where(infra: Any, cloud: Any, region: Any, draft: Draft) -> None:
    """`infra: aws/us-east-1[/zone]` or `cloud:` + `region:` -> cloud and regions."""
    names: list[Any] = []
    if isinstance(infra, str) and infra.strip():
        parts = infra.strip().split("/")
        names.append(parts[0])
        if len(parts) > 1 and region is None:
            region = parts[1]
        if len(parts) > 2:
            draft.note(
                "resources.infra", f"the zone {shown(parts[2])} is not chosen by gpucloud; dropped.", "resources"
            )
    elif infra is not None:
        draft.note("resources.infra", f"{shown(infra)} is not cloud/region; dropped.", "resources")
    if cloud is not None:
        names.append(cloud)
    kept = gpucloud_clouds(names, "resources.infra" if infra is not None else "resources.cloud", draft)
    if kept:
        draft.resources["cloud"] = kept if len(kept) > 1 else kept[0]
    if isinstance(region, str) and region.strip() and (kept or not names):
        draft.resources["regions"] = [region.strip().lower()]
    elif region is not None:
        draft.note("resources.region", f"{shown(region)} belongs to a cloud gpucloud does not plan; dropped.")


def _machine(rest: dict[str, Any], draft: Draft) -> None:
    """instance_type, cpus, memory, disk_size (SkyPilot's "8+" is a minimum; a bare number is
    exact there and a minimum in gpucloud)."""
    res = draft.resources
    if "instance_type" in rest:
        res["instance_type"] = str(rest.pop("instance_type"))
    for key, target in (("cpus", "min_vcpus"), ("memory", "min_memory_gib")):
        if key not in rest:
            continue
        value = rest.pop(key)
        number = whole(value) if key == "cpus" else size_gb(value)
        if number is None:
            draft.note(f"resources.{key}", f"{shown(value)} is not a number; dropped.", "resources")
            continue
        res[target] = int(number) if float(number).is_integer() else number
        if not str(value).strip().endswith("+"):
            draft.note(
                f"resources.{key}", f"{shown(value)} is exact in SkyPilot and a minimum in gpucloud.", "resources"
            )
    if "disk_size" in rest:
        value = rest.pop("disk_size")
        gb = size_gb(value)
        if gb is None:
            draft.note("resources.disk_size", f"{shown(value)} is not a size; dropped.", "resources")
        else:
            res["disk_gb"] = max(20, int(gb))
            if int(gb) < 20:
                draft.note("resources.disk_size", f"{shown(value)}: gpucloud's smallest disk is 20 GB.", "resources")


def _image(value: Any, draft: Draft) -> None:
    text = value.strip() if isinstance(value, str) else ""
    if text.startswith("docker:"):
        draft.job["container"] = text[len("docker:") :].strip()
    elif text.startswith("ami-"):
        draft.job["image"] = text
    else:
        draft.note(
            "resources.image_id",
            f"{shown(value)}: gpucloud takes image: ami-... (AWS) or an Azure URN, or container: IMAGE for "
            "docker:IMAGE; a per-region map has no equivalent. Dropped: gpucloud picks the image from the GPU.",
            "resources",
        )


# ---------------------------------------------------------------------------------------------
# envs, secrets, workdir, file_mounts, setup and run


def _envs(envs: Any, secrets: Any, draft: Draft) -> None:
    env: dict[str, str] = {}
    names: list[str] = []
    if isinstance(envs, dict):
        for key in env_names(list(envs), "envs", draft):
            if envs[key] is None:  # SkyPilot: the value must be given with --env at launch
                names.append(key)
            else:
                env[key] = env_text(envs[key])
        if names:
            draft.note(
                "envs",
                f"{', '.join(names)} had no value (SkyPilot's --env): now secrets, whose values come from "
                "your environment, --secret or --secret-file.",
                "secrets",
            )
    elif envs is not None:
        draft.note("envs", f"{shown(envs)} is not a mapping; dropped.", "env")
    if isinstance(secrets, dict):
        names += [k for k in env_names(list(secrets), "secrets", draft) if k not in names]
        valued = [k for k in secrets if secrets[k] is not None]
        if valued:
            draft.note(
                "secrets",
                f"{', '.join(map(shown, valued))}: a secret's value never goes in a gpucloud job file; set it "
                "in your environment (or --secret NAME=VALUE) when you plan and run.",
                "secrets",
            )
    elif secrets is not None:
        draft.note("secrets", f"{shown(secrets)} is not a mapping; dropped.", "secrets")
    if env:
        draft.job["env"] = env
    if names:
        draft.job["secrets"] = [n for n in names if n not in env]


def _workdir(value: Any, draft: Draft) -> None:
    if isinstance(value, str) and value.strip():
        draft.job["workdir"] = value.strip()
        draft.say("workdir is relative to this job file's folder (SkyPilot's was relative to where you ran sky).")
    elif value is not None:
        draft.note(
            "workdir",
            f"{shown(value)}: a git workdir has no equivalent; clone it in setup (git clone URL).",
            "workdir",
        )


def _file_mounts(value: Any, field: str, draft: Draft) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        draft.note(field, f"{shown(value)} is not a mapping; dropped.")
        return
    for target, source in value.items():
        _mount(str(target), source, f"{field}.{shown(target)}", draft)


def _mount(target: str, source: Any, field: str, draft: Draft) -> None:
    """One file mount: a bucket URL -> inputs (copied, or mounted read-only for MOUNT modes); a
    bucket SkyPilot creates by name (written by the job) -> outputs; a local path -> a note."""
    mode = "copy"
    if isinstance(source, dict):
        mode = "mount" if str(source.get("mode", "MOUNT")).upper().startswith("MOUNT") else "copy"
        name, store, url = source.get("name"), str(source.get("store") or "s3").lower(), source.get("source")
        if url is None and isinstance(name, str) and name.strip() and store == "s3":
            dest = f"s3://{name.strip()}/{draft.job.get('name', 'imported')}"
            draft.job.setdefault("outputs", {})[target] = dest
            draft.note(
                field,
                f"SkyPilot creates and mounts bucket {shown(name)}; gpucloud creates no bucket and uploads "
                f"{target} to {dest} when the job ends (outputs_sync: interval for every checkpoint_interval; "
                "gpucloud grants a prefix, never a whole bucket). Create the bucket first.",
                "outputs",
            )
            return
        source = url if url is not None else name
    text = source.strip() if isinstance(source, str) else ""
    if text.startswith(("s3://", "https://")):
        draft.job.setdefault("inputs", {})[target] = {"source": text, "mode": mode} if mode == "mount" else text
        if mode == "mount":
            draft.note(field, "mounted read-only by gpucloud; add outputs: for what the job writes.", "inputs")
        return
    if "://" in text:
        draft.note(field, f"{shown(text)}: gpucloud reads s3://, az:// and https:// sources; dropped.", "inputs")
    elif text:
        draft.note(
            field,
            f"the local {shown(text)} is not uploaded: put it in the workdir, or add inputs: {{{target}: PATH}} "
            "with a path inside the job file's folder.",
            "inputs",
        )
    else:
        draft.note(field, "names no bucket; fill in a bucket and add it under inputs: or outputs:.", "inputs")


def _scripts(setup: Any, run: Any, draft: Draft) -> None:
    for key, value in (("setup", setup), ("run", run)):
        if value is None:
            continue
        if not isinstance(value, str):
            draft.note(key, f"{shown(value, 40)} is not a shell script; dropped.", key)
            continue
        script, used = with_peer_variables(value, NODE_VARIABLES)
        draft.job[key] = script
        if used:
            draft.say(f"{', '.join(used)} set from gpucloud's GPUCLOUD_* variables.", key)
    if "run" not in draft.job:
        draft.job["run"] = "true"
        draft.note("run", "the task has no run command; gpucloud needs one (`true` does nothing).", "run")
