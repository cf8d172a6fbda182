"""EC2's instance metadata service as cloud-init's EC2 datasource and gpucloud's agent read it:
IMDSv2 only (a session token from `PUT /latest/api/token`, every GET carrying it, 401 without),
the meta-data tree with its folder listings, the user-data, the instance identity document, the
role's credentials, the spot instance-action (404 until `preempt`) and the launch's key pair as
`public-keys/0/openssh-key` (listed as `0=NAME`, as EC2 serves a KeyName's public half), which
cloud-init installs for the image's default user."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "guest-imds-token"
VERSIONS = ("latest", "2021-03-23", "2016-09-02", "2009-04-04")


class Ec2Metadata:
    """One instance's metadata; `url` once started; `seen` lists "METHOD path" in order."""

    def __init__(
        self,
        instance_id: str,
        user_data: str,
        *,
        region: str = "us-east-1",
        role: str = "",
        key: tuple[str, str] = ("", ""),
    ) -> None:
        """`key`: (key pair name, its public half in OpenSSH form) of a launch with a KeyName."""
        self.user_data = user_data.encode()
        self.key_name = key[0]
        self.preempted = False
        self.seen: list[str] = []
        creds = {
            "Code": "Success",
            "AccessKeyId": "ASIAGUEST",
            "SecretAccessKey": "guest-secret",
            "Token": "guest-session",
            "Expiration": (datetime.now(UTC) + timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        self.tree: dict[str, Any] = {
            "ami-id": "ami-0guest",
            "ami-launch-index": "0",
            "hostname": "guest.ec2.internal",
            "local-hostname": "guest.ec2.internal",
            "local-ipv4": "169.254.169.15",
            "instance-id": instance_id,
            "instance-type": "g4dn.xlarge",
            "mac": "52:54:00:12:34:56",
            "placement": {"availability-zone": f"{region}a", "region": region},
            "iam": {"security-credentials": {role: json.dumps(creds)}} if role else {},
        }
        if key[0]:
            self.tree["public-keys"] = {"0": {"openssh-key": key[1].strip() + "\n"}}
        self.identity = json.dumps(
            {"instanceId": instance_id, "region": region, "availabilityZone": f"{region}a", "accountId": "123"}
        )
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]

    def start(self) -> Ec2Metadata:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, path: str) -> tuple[int, bytes]:
        """(code, body) of a GET that carried a valid token."""
        version, _, rest = path.lstrip("/").partition("/")
        if version not in VERSIONS:
            return 404, b""
        if rest == "user-data":
            return 200, self.user_data
        if rest.rstrip("/") == "dynamic/instance-identity":
            return 200, b"document"
        if rest == "dynamic/instance-identity/document":
            return 200, self.identity.encode()
        if rest == "meta-data/spot/instance-action":
            body = json.dumps({"action": "terminate", "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")})
            return (200, body.encode()) if self.preempted else (404, b"")
        if not rest.startswith("meta-data"):
            return 404, b""
        if rest.rstrip("/") == "meta-data/public-keys" and self.key_name:
            return 200, f"0={self.key_name}".encode()  # EC2 lists a key by index=name, not as a folder
        node: Any = self.tree
        for part in [p for p in rest[len("meta-data") :].split("/") if p]:
            if not isinstance(node, dict) or part not in node:
                return 404, b""
            node = node[part]
        if isinstance(node, dict):
            return 200, "\n".join(k + ("/" if isinstance(v, dict) else "") for k, v in node.items()).encode()
        return 200, str(node).encode()


def _handler(md: Ec2Metadata) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self) -> None:  # noqa: N802
            md.seen.append(f"PUT {self.path}")
            ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
            self._send(200 if ok else 400, TOKEN.encode() if ok else b"")

        def do_GET(self) -> None:  # noqa: N802
            md.seen.append(f"GET {self.path}")
            if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                self._send(401, b"")
                return
            self._send(*md.answer(self.path.split("?", 1)[0]))

        def log_message(self, *args: object) -> None:
            pass

    return Handler
