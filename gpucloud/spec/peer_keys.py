"""What a SkyPilot or dstack key is called in a gpucloud job file: `validate` names the equivalent
(or says there is none and what to do instead) where a spelling match would suggest a wrong key
(`disk_tier` is not `disk_gb`, `ports` is not `spot`). `gpucloud import` converts whole files."""

from __future__ import annotations

# Unknown key -> the sentence that replaces "did you mean". Keyed by the key alone: peers put
# `accelerators`, `image_id` and `ports` under resources and dstack puts `ports` at the top, and a
# newcomer moves keys between levels too.
PEER_MARK = "(SkyPilot/dstack)"
PEER_KEYS: dict[str, str] = {
    "accelerators": "gpucloud's is resources.gpu, e.g. `gpu: V100:1` (a list of alternatives works too)",
    "accelerator_args": "it has no equivalent (TPU settings); leave it out",
    "commands": "gpucloud's is run: one shell script, the commands on separate lines under `run: |`",
    "file_mounts": "gpucloud's is inputs, a folder on the machine mapped to a source, e.g. "
    "`inputs: {data/: s3://bucket/path}` (outputs: for what goes back to a bucket)",
    "storage_mounts": "gpucloud's is inputs with `mode: mount` (docs/DATA.md)",
    "type": "every gpucloud job file is one task, so there is no type: remove it",
    "image_id": "gpucloud's is container: for a Docker image (`container: nvcr.io/nvidia/pytorch:24.08-py3`) "
    "or image: for a machine image (an AMI id or Azure image URN)",
    "docker": "gpucloud's is container: (the image's name; docs/CONTAINERS.md)",
    "ports": "gpucloud's is ports: at the top of the job file (`ports: [8888]`), forwarded by `gpucloud ssh RUN` "
    "to your own machine's loopback only; nothing is opened to the world",
    "disk_tier": "it has no equivalent: each cloud's disk type is chosen for you; disk_gb sets only the size",
    "disk_size": "gpucloud's is resources.disk_gb (GB)",
}


def peer_key_message(word: str, known: list[str]) -> str | None:
    """The unknown-key message for a key another tool uses, None for any other key (or one that
    exists at this level under the same name: then the ordinary message is the right one)."""
    if word in known or word not in PEER_KEYS:
        return None
    return f"unknown key '{word}' {PEER_MARK}: {PEER_KEYS[word]}"


def import_hint(messages: list[str], filename: str) -> str | None:
    """The closing sentence for a file with a peer's key that is no whole peer file (peers.peer_hint
    names those): the import command still converts the rest of what the peer wrote."""
    if not any(PEER_MARK in m for m in messages):
        return None
    return f"Keys from SkyPilot or dstack: `gpucloud import {filename}` converts such a file as a whole."
