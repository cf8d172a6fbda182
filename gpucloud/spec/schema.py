"""The job file's JSON schema as an editor shows it: a description on every field people write, the
cloud names as an enum, and none of the model's internal fields (what `gpu: [..]` and `gpu: A|B`
become inside), which a user must not be offered as keys of their own."""

from __future__ import annotations

from typing import Any

# Fields the models keep for their own use: the schema does not offer them.
HIDDEN: dict[str, tuple[str, ...]] = {
    "resources": ("gpu_options",),
    "gpurequest": ("other_models",),
    "stackspec": ("framework_version",),
}

# (section, key) -> what belongs there; sections as in FIELD_HINTS plus the $defs' lower-case names.
DESCRIPTIONS: dict[tuple[str, str], str] = {
    ("", "container"): "A container image the job's setup and run execute in (docs/CONTAINERS.md); the "
    "host gets only the driver and an engine. An image name, or a mapping with image, options, user, login.",
    ("", "secrets"): "Names of secrets (e.g. [HF_TOKEN]); their values come from your environment, "
    "--secret or --secret-file, never from the file (docs/DATA.md).",
    ("", "inputs"): "Folders on the machine mapped to a source: {data/: s3://bucket/path}; also az://, "
    "https://, a local path, or {source: ..., mode: mount}. Copied before setup (docs/DATA.md).",
    ("", "outputs"): "Folders on the machine uploaded to a bucket at the end: {ckpt/: s3://bucket/run}.",
    ("", "outputs_sync"): "end (upload outputs at the end) or interval (also every checkpoint_interval).",
    ("", "ports"): "TCP ports on the node that `gpucloud ssh RUN` forwards to this machine's loopback, "
    "e.g. [6006, 8888] (docs/SSH.md).",
    ("", "checkpoint"): "A folder kept across spot attempts and restored before a relaunch (docs/SPOT.md).",
    ("", "checkpoint_interval"): "How often the checkpoint folder is saved, e.g. 10m.",
    ("", "recovery"): "Relaunch the job when its machine is preempted or lost: "
    "{on: [preemption], max_restarts: 3, fallback: on-demand} (docs/SPOT.md).",
    ("resources", "cloud"): "Where the job runs: aws, azure, local (this machine), ssh (your machines: "
    "hosts), slurm (your cluster: cluster), a list of them, or any (the clouds; the default).",
    ("resources", "regions"): "Regions to consider, e.g. [us-east-1]; all of the cloud's when left out.",
    ("resources", "spot"): "false (on-demand), true (spot only) or auto (spot when cheaper, on-demand as fallback).",
    ("resources", "hosts"): "cloud: ssh only: your machines, [user@]host[:port] or ~/.ssh/config aliases.",
    ("resources", "cluster"): "cloud: slurm only: the login node ([user@]host[:port], an ssh alias, or local).",
    ("resources", "partition"): "cloud: slurm only: the partition to submit to.",
    ("resources", "account"): "cloud: slurm only: the account to charge.",
    ("resources", "qos"): "cloud: slurm only: the quality of service.",
    ("resources", "constraint"): "cloud: slurm only: a node feature constraint (sbatch --constraint).",
    ("stackspec", "driver"): "The NVIDIA driver branch, e.g. 535, or auto (resolved from the GPU).",
    ("stackspec", "cuda"): "The CUDA version, e.g. 12.4, or auto (resolved from the GPU and driver).",
    ("stackspec", "cudnn"): "The cuDNN version, e.g. 9, or auto.",
    ("stackspec", "framework"): "pytorch, tensorflow or none; pin a version with pytorch==2.1.2.",
    ("stackspec", "cuda_toolkit"): "Install the system CUDA toolkit and cuDNN too (framework wheels bundle their own).",
    ("stackspec", "install"): "On machines you own: may gpucloud install the driver there (passwordless sudo).",
    ("containerspec", "image"): "The image, e.g. nvcr.io/nvidia/pytorch:24.08-py3.",
    ("containerspec", "options"): "Extra engine options (a vetted few; docs/CONTAINERS.md).",
    ("containerspec", "user"): "The user the job runs as inside the container.",
    ("containerspec", "entrypoint"): "The image's entrypoint replaced by this one.",
    ("containerspec", "login"): "How to log in to the registry: {username, password_secret, registry}.",
    ("containerspec", "pull"): "missing (pull only when the machine lacks the image), always or never; "
    "default missing on your own hosts, always on cloud VMs.",
    ("containerlogin", "username"): "The registry user.",
    ("containerlogin", "password_secret"): "The name of the secret that holds the registry password.",
    ("containerlogin", "registry"): "The registry host, when it is not the image's.",
    ("inputform", "source"): "Where the input comes from: s3://, az://, https:// or a local path.",
    ("inputform", "mode"): "copy (before setup; the default) or mount (read on demand).",
    ("recovery", "on"): "What starts a new attempt: preemption, capacity, lost.",
    ("recovery", "max_restarts"): "New attempts at most.",
    ("recovery", "fallback"): "on-demand: the restart after the last allowed preemption goes to on-demand; or none.",
}


def refine(schema: dict[str, Any]) -> None:
    """Add the descriptions the field hints do not give and drop the internal fields, in place."""
    sections = {"": schema, **{k.lower(): v for k, v in schema.get("$defs", {}).items()}}
    for section, keys in HIDDEN.items():
        props = sections.get(section, {}).get("properties", {})
        for key in keys:
            props.pop(key, None)
    for (section, key), text in DESCRIPTIONS.items():
        prop = sections.get(section, {}).get("properties", {}).get(key)
        if prop is not None:
            prop.setdefault("description", text)
