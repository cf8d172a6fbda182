"""The agent's own Azure Blob token (gpucloud/vm/agent/blob_token.py): read from IMDS, cached and
read again before it expires, SAS fields swapped for it, and the SAS as the fallback of a refused
Append Block (the end to end proof is tests/providers/azure/test_azure_node_identity.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpucloud.vm.agent.blob_token import BlobBearer, ManagedIdentityToken, without_sas
from gpucloud.vm.agent.transfer import Transfer

SAS = "sv=2022-11-02&st=2026-12-07T00%3A00%3A00Z&se=2026-12-14T00%3A00%3A00Z&sr=b&sp=a&spr=https&sig=abc%2Bdef%3D"


class Imds:
    """IMDS as the agent sees it through Transfer.request: one token per call, or nothing."""

    def __init__(self, clock: list[float], life: float = 3600) -> None:
        self.clock, self.life, self.calls, self.down = clock, life, [], False

    def __call__(self, method: str, url: str, headers: list[str], max_time: float = 20) -> bytes | None:
        self.calls.append((method, url, list(headers)))
        if self.down:
            return None
        now = self.clock[0]
        doc = {"access_token": f"tok-{len(self.calls)}", "expires_on": str(int(now + self.life))}
        return json.dumps(doc).encode()


def test_token_is_cached_and_read_again_five_minutes_before_expiry() -> None:
    clock = [1_000_000.0]
    imds = Imds(clock)
    token = ManagedIdentityToken(imds, "http://imds.example/", now=lambda: clock[0])
    assert token.get() == "tok-1"
    method, url, headers = imds.calls[0]
    assert method == "GET" and headers == ["Metadata: true"]
    assert url == (
        "http://imds.example/metadata/identity/oauth2/token?api-version=2018-02-01&resource=https%3A%2F%2Fstorage.azure.com%2F"
    )
    clock[0] += 3000  # 600 s left: still the cached one
    assert token.get() == "tok-1" and len(imds.calls) == 1
    clock[0] += 400  # 200 s left: read again
    assert token.get() == "tok-2" and token.fetches == 2


def test_no_imds_gives_no_token_and_is_asked_again_a_minute_later() -> None:
    clock = [1_000_000.0]
    imds = Imds(clock)
    imds.down = True
    token = ManagedIdentityToken(imds, "http://imds.example", now=lambda: clock[0])
    assert token.get() is None and token.get() is None
    assert len(imds.calls) == 1
    imds.down = False
    clock[0] += 61
    assert token.get() == "tok-2"


def test_sas_fields_are_swapped_for_the_bearer_token() -> None:
    clock = [1_000_000.0]
    bearer = BlobBearer(ManagedIdentityToken(Imds(clock), "http://imds", now=lambda: clock[0]), now=lambda: clock[0])
    url = f"https://acct.blob.core.windows.net/gpucloud/runs/r/node-0/log.append?{SAS}&comp=appendblock"
    signed = bearer.signed("PUT", url)
    assert signed is not None
    assert signed[0] == "https://acct.blob.core.windows.net/gpucloud/runs/r/node-0/log.append?comp=appendblock"
    assert signed[1][0] == "Authorization: Bearer tok-1"
    assert "x-ms-version: 2022-11-02" in signed[1] and any(h.startswith("x-ms-date: ") for h in signed[1])
    assert bearer.signed("GET", f"http://127.0.0.1:10000/devstoreaccount1/c/b?{SAS}") is None  # Bearer needs https
    assert bearer.signed("GET", "https://acct.blob.core.windows.net/c/b") is None  # no SAS: not a grant
    assert without_sas(f"https://h/c/b?{SAS}") == "https://h/c/b"


class _Blobs(BaseHTTPRequestHandler):
    """Append Block: refused (403) with the node's token while `refuse_token`, else 201."""

    seen: list[tuple[str, str]] = []
    refuse_token = True
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        auth = self.headers.get("Authorization", "")
        self.seen.append((self.path, auth))
        body = b"" if auth and self.refuse_token else b"the blob"
        self.send_response(403 if auth and self.refuse_token else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        auth = self.headers.get("Authorization", "")
        self.seen.append((self.path, auth))
        code = 403 if auth and self.refuse_token else 201
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class _Own:
    """A signer for the plain-http test server (BlobBearer itself signs https URLs only)."""

    hides_missing = False

    def signed(self, method: str, url: str, region: str | None = None) -> tuple[str, list[str]]:
        query = "?comp=appendblock" if "comp=appendblock" in url else ""
        return url.split("?", 1)[0] + query, ["Authorization: Bearer t", "x-ms-version: 2022-11-02"]


@pytest.fixture
def blobs() -> Iterator[str]:
    _Blobs.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Blobs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_append_block_goes_with_the_token_and_falls_back_to_the_sas(blobs: str, tmp_path: Path) -> None:
    part = tmp_path / "part"
    part.write_bytes(b"log line\n")
    transfer = Transfer()
    transfer.signer = _Own()
    url = f"{blobs}/c/runs/r/node-0/log.append?{SAS}"
    _Blobs.refuse_token = False
    assert transfer.append_block(url, part, 0)
    assert _Blobs.seen == [("/c/runs/r/node-0/log.append?comp=appendblock", "Bearer t")]
    _Blobs.refuse_token = True
    assert transfer.append_block(url, part, 9)
    assert _Blobs.seen[1:] == [
        ("/c/runs/r/node-0/log.append?comp=appendblock", "Bearer t"),
        (f"/c/runs/r/node-0/log.append?{SAS}&comp=appendblock", ""),
    ]


def test_a_refused_token_reads_the_blob_through_the_sas_not_as_missing(blobs: str) -> None:
    """Blob answers 404 for a missing blob the token may read, so a 403 is a refusal (an assignment
    not seen yet): the SAS follows, unlike S3's 403-for-missing (sigv4.Signer.hides_missing)."""
    transfer = Transfer()
    transfer.signer = _Own()
    _Blobs.refuse_token = True
    assert transfer.get(f"{blobs}/c/runs/r/node-0/notice?{SAS}") == b"the blob"
    assert [auth for _, auth in _Blobs.seen] == ["Bearer t", ""]
