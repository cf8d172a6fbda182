"""Input and output data for the data tests: random files and their digest (the same digest the job
computes with DIGEST_PY on the node), and an Azurite blob container the CLI is pointed at."""

from __future__ import annotations

import hashlib
import os

import pytest

from tests.support.azurite import Azurite

FILES = int(os.environ.get("GPUCLOUD_DATA_E2E_FILES", "200"))


TOTAL_MB = float(os.environ.get("GPUCLOUD_DATA_E2E_MB", "20"))


DIGEST_PY = """
import hashlib, os, sys
root = sys.argv[1]
h = hashlib.sha256()
n = 0
for dirpath, dirs, files in os.walk(root):
    dirs.sort()
    for name in sorted(files):
        rel = os.path.relpath(os.path.join(dirpath, name), root)
        h.update(rel.encode() + b"\\0" + open(os.path.join(dirpath, name), "rb").read())
        n += 1
print("DIGEST", root, n, h.hexdigest())
"""


def make_files(count: int = FILES, total_mb: float = TOTAL_MB) -> dict[str, bytes]:
    """`count` random files in folders of 100, `total_mb` in all, by relative path."""
    size = max(1, int(total_mb * 1e6 / count))
    return {f"part-{i // 100:02d}/f{i:05d}.bin": os.urandom(size) for i in range(count)}


def digest(files: dict[str, bytes]) -> str:
    """What DIGEST_PY prints for these files, computed here."""
    h = hashlib.sha256()
    for rel in sorted(files, key=lambda r: (r.split("/")[:-1], r.split("/")[-1])):
        h.update(rel.encode() + b"\0" + files[rel])
    return h.hexdigest()


def use_azurite(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the CLI's Azure Blob access at Azurite, with its account key."""
    monkeypatch.setenv("GPUCLOUD_AZURE_BLOB_ENDPOINT", azurite.blob_endpoint)
    monkeypatch.setenv("AZURE_STORAGE_KEY", azurite.account_key)


def blob_container(azurite: Azurite, name: str) -> object:
    """Azurite's container `name`, created when missing."""
    from azure.storage.blob import BlobServiceClient

    svc = BlobServiceClient(
        azurite.blob_endpoint, credential={"account_name": azurite.account_name, "account_key": azurite.account_key}
    )
    c = svc.get_container_client(name)
    if not c.exists():
        c.create_container()
    return c
