"""An https front before Azurite that authorises Bearer tokens as Azure RBAC and ABAC would, but
stricter: the least-privilege proof of the Azure node identity (Azurite's OAuth mode checks a
token's issuer, audience and times, never a role).

For a request with `Authorization: Bearer`: the token must be one the fake ARM's IMDS issued for
the storage audience, not revoked; its principal needs a role assignment whose scope is the
request's container and whose role (built-in or custom: FakeArm.role_permissions) holds the
request's data action in its DataActions, and the assignment's condition must admit that data
action on the blob's path (abac.py: a condition it cannot read admits nothing). A request on no
blob (the container, a listing) is refused. Refusals are Azure's 403 `AuthorizationPermissionMismatch`
(401 for a token it does not know). Requests with a SAS pass through while `refuse_sas` is False;
once set, every SAS is refused with 403 `AuthenticationFailed`, as an expired or revoked one is:
the CLI's grants made useless. Shared Key requests (the CLI's own) pass through.
"""

from __future__ import annotations

import http.client
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.support.abac import ConditionError, allows, data_action
from tests.support.arm_actions import allowed as role_allows
from tests.support.fake_arm import STORAGE_AUDIENCE, FakeArm

ERROR = '<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>{message}</Message></Error>'
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length"}


@dataclass
class Seen:
    """One request the front answered itself or passed on: for a test's assertions."""

    method: str
    blob: str
    auth: str  # "bearer" | "sas" | "key" | "none"
    status: int


@dataclass
class BlobFront:
    arm: FakeArm
    upstream_port: int
    cert: Path
    key: Path
    refuse_sas: bool = False
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        handler = type("Handler", (_Handler,), {"front": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(self.cert), str(self.key))
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.upstream = ssl.create_default_context(cafile=str(self.cert))
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def blob_endpoint(self) -> str:
        return f"https://127.0.0.1:{self.server.server_address[1]}/devstoreaccount1"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def record(self, seen: Seen) -> None:
        with self.lock:
            self.seen.append(seen)

    def requests(self, auth: str) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.auth == auth]

    def refusal(self, token: str, method: str, query: str, container: str, blob: str) -> tuple[int, str, str] | None:
        """None when the token's principal may do this; else (status, code, message)."""
        principal = self.arm.principal_of(token)
        with self.arm.lock:
            audience = self.arm.audiences.get(token, "")
        if principal is None or audience.rstrip("/") != STORAGE_AUDIENCE:
            return 401, "InvalidAuthenticationInfo", "Server failed to authenticate the request."
        action = data_action(method, query)
        if action is None or not blob:
            return 403, "AuthorizationPermissionMismatch", "This request is not a blob data action of a node."
        for props in self.arm.assignments_of(principal):
            perms = self.arm.role_permissions(str(props.get("roleDefinitionId", "")))
            scope = str(props.get("scope", "")).lower().rstrip("/")
            if perms is None or not scope.endswith(f"/containers/{container.lower()}"):
                continue
            if not role_allows(action, perms["dataActions"], perms["notDataActions"]):
                continue
            try:
                if props.get("condition") is None or allows(str(props["condition"]), action, blob):
                    return None
            except ConditionError:
                continue
        return 403, "AuthorizationPermissionMismatch", f"{principal} may not {action} on {blob}."


class _Handler(BaseHTTPRequestHandler):
    front: BlobFront
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                chunk = self.rfile.read(size + 2)[:size]
                if not size:
                    return out
                out += chunk
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            if name.lower() not in HOP_HEADERS:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _handle(self) -> None:
        front = self.front
        split = urlsplit(self.path)
        parts = unquote(split.path).lstrip("/").split("/", 2)
        container = parts[1] if len(parts) > 1 else ""
        blob = parts[2] if len(parts) > 2 else ""
        body = self._body()
        auth = self.headers.get("Authorization", "")
        kind = "bearer" if auth.startswith("Bearer ") else "key" if auth else "none"
        if kind == "none" and "sig" in parse_qs(split.query):
            kind = "sas"
        refused = None
        if kind == "bearer":
            refused = front.refusal(auth[7:], self.command, split.query, container, blob)
        elif kind == "sas" and front.refuse_sas:
            refused = 403, "AuthenticationFailed", "Signature not valid in the specified time frame (revoked)."
        if refused is not None:
            front.record(Seen(self.command, blob, kind, refused[0]))
            xml = ERROR.format(code=refused[1], message=refused[2]).encode()
            return self._reply(refused[0], [("Content-Type", "application/xml"), ("x-ms-error-code", refused[1])], xml)
        conn = http.client.HTTPSConnection("127.0.0.1", front.upstream_port, context=front.upstream, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
            headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
            front.record(Seen(self.command, blob, kind, answer.status))
            self._reply(answer.status, answer.getheaders(), data)
        finally:
            conn.close()

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _handle
