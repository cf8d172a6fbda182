"""`gpucloud ssh` on Azure: real ssh to the node's public address with a key pair of the run's own
(made at launch for a job with `resources.ssh: true` or `ports:`, its private half 0600 under
GPUCLOUD_HOME, its public half the VM's one authorised key, removed with the run), through the
NSG's one rule for port 22 from the caller's address /32 (machine.py `nsg_body`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpucloud.contract.provider import RunHandle
from gpucloud.contract.session import CloudNode, SessionAsk, SessionPlan, cloud_session, unsupported
from gpucloud.errors import UserError
from gpucloud.providers.azure.machine import ADMIN_USER

CLOUD = "azure"


def keys_dir() -> Path:
    from gpucloud.state.home import home_dir

    return home_dir() / "keys"


def run_key_path(run_id: str, region: str, attempt: int) -> Path:
    return keys_dir() / f"gpucloud-{run_id}-{region}-{attempt}.key"


def make_run_key(path: Path) -> str:
    """A fresh Ed25519 key pair: the private half written 0600 at `path` (OpenSSH format, what
    `ssh -i` reads), the public half returned for the VM's authorised keys."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(private)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return public.decode() + f" gpucloud-{path.stem}"


def forget_keys(run_id: str, region: str) -> None:
    """The run's keys in this region go with its machines."""
    folder = keys_dir()
    for path in folder.glob(f"gpucloud-{run_id}-{region}-*.key") if folder.is_dir() else []:
        path.unlink(missing_ok=True)


def azure_session(network: Any, group: str, handle: RunHandle, rank: int, ask: SessionAsk, vm_dir: str) -> SessionPlan:
    """The node's public address from its `pip-N` resource, the run's key file, then ssh."""
    from azure.core.exceptions import ResourceNotFoundError

    key = run_key_path(handle.run_id, handle.region, handle.attempt)
    if not key.is_file():
        raise unsupported(
            CLOUD,
            f"run {handle.run_id} was launched without `resources.ssh: true` (or `ports:`), so its nodes have "
            "neither the run's key nor a rule admitting you; gpucloud does not open one afterwards",
        )
    try:
        address = network.public_ip_addresses.get(group, f"pip-{rank}").ip_address or ""
    except ResourceNotFoundError:
        address = ""
    if not address:
        raise UserError(f"node {rank} of run {handle.run_id} has no public address in {group}: it is gone.")
    return cloud_session(CloudNode(handle.run_id, rank, address, ADMIN_USER, key, vm_dir), ask)
