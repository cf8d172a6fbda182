"""The run owner's key: an Ed25519 key made for a kept run, whose private half stays 0600 in
`$GPUCLOUD_HOME/runs/<run>/owner.key` and whose public half goes into the node's job.json (pinned
by the user-data's archive hash). A kept machine runs only the job requests this key signed, so
whoever else can write the run's channel cannot plant a job (docs/SECURITY.md, "Kept machines").
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import TYPE_CHECKING

from gpucloud.errors import UserError
from gpucloud.state.home import home_dir

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

KEY_NAME = "owner.key"


def key_path(run_id: str, home: Path | None = None) -> Path:
    return (home or home_dir()) / "runs" / run_id / KEY_NAME


def owner_public(run_id: str, home: Path | None = None) -> str:
    """The run's owner key's public half (base64 of the raw 32 bytes), the key made on first use."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = key_path(run_id, home)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        raw = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
    pub = _private(path).public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(pub).decode()


def owner_sign(run_id: str, body: bytes, home: Path | None = None) -> str:
    """The base64 signature of `body` by the run's owner key; a UserError when this machine has none."""
    path = key_path(run_id, home)
    if not path.is_file():
        raise UserError(
            f"run {run_id} was not started from this GPUCLOUD_HOME: its owner key {path} is missing, "
            "and a kept machine takes jobs only from the key that started it.",
            hint="Run the command where the run was started, or start a new run with keep.",
        )
    return base64.b64encode(_private(path).sign(body)).decode()


def _private(path: Path) -> Ed25519PrivateKey:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(path.read_bytes())
