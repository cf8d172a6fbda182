"""What anyone who can read a VM's user-data can do with it (the channel's trust tests): the script
inside, the manifest and the grants it names, and a PUT through one of those grants."""

from __future__ import annotations

import gzip
import re
import subprocess
import urllib.request


def user_data_script(user_data: bytes) -> str:
    """The user-data's script, gzipped or not."""
    return (gzip.decompress(user_data) if user_data[:2] == b"\x1f\x8b" else user_data).decode()


def fetch(url: str) -> bytes:
    """GET a URL (a presigned or SAS one needs nothing else)."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        return bytes(resp.read())


def read_grants(script: str) -> dict[str, str]:
    """What the reader gets from the user-data: the manifest URL, then the manifest's grants."""
    m = re.search(r"^MANIFEST_URL=(.*)$", script, re.MULTILINE)
    assert m, "no manifest URL in the user-data"
    url = m.group(1).strip().strip("'")
    text = fetch(url).decode()
    if text.startswith("manifest "):  # a shared user-data's node index
        url = text.split("\n", 1)[0].split(" ", 2)[2]
        text = fetch(url).decode()
    grants: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "log_post_field":
            grants.setdefault("fields", "")
            grants["fields"] += value + "\n"
        else:
            grants.setdefault(key, value)
    return grants


def upload_file(data: bytes) -> str:
    """A file for curl -T / -F (a body from stdin is chunked, which Azure Blob refuses)."""
    import tempfile

    with tempfile.NamedTemporaryFile(delete=False, prefix="forged-") as fh:
        fh.write(data)
    return fh.name


def put_with_grant(url: str, data: bytes, headers: tuple[str, ...] = ()) -> None:
    """PUT `data` to a grant's URL with curl, as a reader with no SDK would."""
    args = ["curl", "-fsS", "--max-time", "10", "-o", "/dev/null", "-T", upload_file(data)]
    for h in headers:
        args += ["-H", h]
    done = subprocess.run([*args, url], capture_output=True, check=False)
    assert done.returncode == 0, f"the reader's PUT failed: {done.stderr!r}"
