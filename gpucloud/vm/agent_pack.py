"""The agent archive the CLI ships through the channel: the agent package and the wire-format
module, read from the installed gpucloud package (so the wheel carries them), plus the run's
job.json. Deterministic (sorted names, zero times, fixed owner), so the SHA-256 the shim checks can
be computed before the upload and is the same for the same job.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from importlib import resources
from importlib.abc import Traversable

# What the node imports: the package markers on the way down, the protocol, the agent.
PACKAGE_FILES = ("__init__.py", "vm/__init__.py", "vm/protocol.py")
AGENT_DIR = "vm/agent"
CONFIG_NAME = "job.json"


def _agent_files() -> list[tuple[str, bytes]]:
    root = resources.files("gpucloud")
    out = [(f"gpucloud/{name}", _read(root, name)) for name in PACKAGE_FILES]
    agent = root.joinpath(AGENT_DIR)
    for entry in sorted(agent.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".py") and entry.is_file():
            out.append((f"gpucloud/{AGENT_DIR}/{entry.name}", entry.read_bytes()))
    return out


def _read(root: Traversable, name: str) -> bytes:
    node = root
    for part in name.split("/"):
        node = node.joinpath(part)
    return node.read_bytes()


def agent_archive(config_json: str) -> bytes:
    """tar.gz bytes: gpucloud/{__init__,vm/__init__,vm/protocol}.py, gpucloud/vm/agent/*.py, job.json."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [*_agent_files(), (CONFIG_NAME, config_json.encode())]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(buf.getvalue(), compresslevel=9, mtime=0)


def archive_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
