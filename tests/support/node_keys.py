"""A node key made by openssl, independently of gpucloud's own code: its public half (base64) and the
seed gpucloud reads from the PEM."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import pytest

from gpucloud.vm.agent import sealed


def openssl_node_key(tmp_path: Path) -> tuple[str, bytes]:
    """(public key in base64, private seed) of an Ed25519 key openssl made; the test skips without openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    pem = tmp_path / "k.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(pem)], check=True)
    der = subprocess.run(
        ["openssl", "pkey", "-in", str(pem), "-pubout", "-outform", "DER"], check=True, capture_output=True
    ).stdout
    return base64.b64encode(der[-32:]).decode(), sealed.seed_from_pem(pem.read_text())


class OneNodeChannel:
    """A channel fake for the secrets' delivery: node 0's claim (its published key) and the objects
    put to the channel."""

    def __init__(self, pub: str) -> None:
        self.pub, self.objects = pub, {}

    def claims(self, run_id: str, rank: int) -> list[tuple[str | None, bytes]]:
        return [(None, self.pub.encode())]

    def put_bytes(self, key: str, blob: bytes) -> None:
        self.objects[key] = blob

    def get_bytes(self, key: str) -> bytes | None:
        return self.objects.get(key)
