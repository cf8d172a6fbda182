"""A tiny registry of the test's own on 127.0.0.1 (real HTTP, no mocks): it answers a manifest
request without a token with 401 and a Bearer challenge, hands out a token at its realm, and then
serves an OCI index, its manifests and a config blob -- or, for the time-budget test, never answers."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "test-token-1"


def _digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


@dataclass
class TokenRegistry:
    """What the server serves and what it saw (paths, Authorization headers, token queries)."""

    repo: str = "team/train"
    tag: str = "1.0"
    env: list[str] = field(default_factory=lambda: ["PATH=/bin", "CUDA_VERSION=12.6.1"])
    seen: list[tuple[str, str]] = field(default_factory=list)
    token_queries: list[str] = field(default_factory=list)
    bad_config_digest: bool = False
    host: str = ""

    def blobs(self) -> dict[str, tuple[str, bytes]]:
        config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": self.env}}).encode()
        other = json.dumps({"architecture": "arm64", "os": "linux", "config": {"Env": ["CUDA_VERSION=9.9"]}}).encode()
        served_config = config + (b" " if self.bad_config_digest else b"")

        def manifest(cfg: bytes) -> bytes:
            return json.dumps(
                {
                    "schemaVersion": 2,
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": _digest(cfg)},
                    "layers": [],
                }
            ).encode()

        amd, arm = manifest(config), manifest(other)
        index = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "manifests": [
                    {"digest": _digest(arm), "platform": {"os": "linux", "architecture": "arm64"}},
                    {"digest": _digest(amd), "platform": {"os": "linux", "architecture": "amd64"}},
                ],
            }
        ).encode()
        oci = "application/vnd.oci.image.manifest.v1+json"
        return {
            f"/v2/{self.repo}/manifests/{self.tag}": ("application/vnd.oci.image.index.v1+json", index),
            f"/v2/{self.repo}/manifests/{_digest(amd)}": (oci, amd),
            f"/v2/{self.repo}/manifests/{_digest(arm)}": (oci, arm),
            f"/v2/{self.repo}/blobs/{_digest(config)}": ("application/octet-stream", served_config),
            f"/v2/{self.repo}/blobs/{_digest(other)}": ("application/octet-stream", other),
        }


@contextmanager
def token_registry(state: TokenRegistry) -> Iterator[TokenRegistry]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            auth = self.headers.get("Authorization", "")
            state.seen.append((path, auth))
            if path == "/token":
                state.token_queries.append(query)
                self._send(200, "application/json", json.dumps({"token": TOKEN}).encode())
                return
            if auth != f"Bearer {TOKEN}":
                self.send_response(401)
                realm = f"http://{state.host}/token"
                scope = f"repository:{state.repo}:pull"
                self.send_header("WWW-Authenticate", f'Bearer realm="{realm}",service="test-registry",scope="{scope}"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            hit = state.blobs().get(path)
            if hit is None:
                self._send(404, "application/json", b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
                return
            self._send(200, *hit)

        def _send(self, code: int, kind: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.host = f"127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def silent_registry() -> Iterator[str]:
    """A port that accepts connections (the kernel's backlog) and never answers: host:port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()
