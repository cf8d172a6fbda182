"""A strict SigV4 front for a test S3 (moto checks no signature and no expiry): every request to
the upstream is verified as S3 does, and some things more strictly, before it passes.

Checked: header-signed requests (`Authorization: AWS4-HMAC-SHA256 ...`, the date within 15 minutes,
a signed payload hash compared with the body), presigned URLs (`X-Amz-Signature`, refused once
`X-Amz-Date + X-Amz-Expires` passed), presigned POST forms (the policy's signature and its
expiration); for all, the access key must be registered, its session token must match, and the
credentials must not have expired (400 ExpiredToken: S3's answer to a session past its end, which
also ends every URL it signed). Anything unsigned is refused. The front's clock can be moved on
(`advance`), so a test sees credentials expire without waiting.

It is an HTTP forward proxy: guests reach it through `http_proxy` (curl honours it) and requests
for other hosts (the simulator's IMDS) pass unchecked. It is also an S3 endpoint of its own
(`base`, for a client that does not proxy loopback addresses, such as rclone's Go HTTP client).
Chosen over s3rver (npm), which checks neither expiry nor session tokens, and LocalStack, which
needs a container runtime per test session.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import threading
import time
from calendar import timegm
from collections.abc import Callable
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, quote, urlsplit

HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "upgrade"}
SKEW_S = 15 * 60


def _q(text: str) -> str:
    return quote(text, safe="-_.~")


def signing_key(secret: str, date: str, region: str) -> bytes:
    key = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def _amz_time(stamp: str) -> float:
    return float(timegm(time.strptime(stamp, "%Y%m%dT%H%M%SZ")))


class Refused(Exception):
    def __init__(self, status: int, code: str, why: str = "") -> None:
        super().__init__(f"{status} {code} {why}")
        self.status, self.code, self.why = status, code, why


class StrictS3:
    """`.start()` / `.stop()`; `register(key, secret, token, expires_epoch)` admits credentials."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream).netloc
        self.creds: dict[str, tuple[str, str, float]] = {}
        self.offset = 0.0
        self.jumped = False
        self.lock = threading.Lock()
        self.answers: list[tuple[str, str, int, str]] = []  # (method, path, code, who)
        self.after_jump: list[tuple[str, str, int, str]] = []
        self.signed_by_node = 0
        self.refused_expired = 0
        self.presigned_after_jump = 0
        # (access key, method, path, query) -> allowed: IAM as S3 applies it to a header-signed request
        self.authorize: Callable[[str, str, str, str], bool] | None = None
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_Handler,), {"front": self}))
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> StrictS3:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def now(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.offset += seconds
            self.jumped = True

    def register(self, key: str, secret: str, token: str, expires: float) -> None:
        with self.lock:
            self.creds[key] = (secret, token, expires)

    def record(self, method: str, path: str, code: int, who: str) -> None:
        with self.lock:
            self.answers.append((method, path, code, who))
            if self.jumped:
                self.after_jump.append((method, path, code, who))
                self.presigned_after_jump += who == "presigned"
            if who == "node" and code < 300:
                self.signed_by_node += 1

    # ---- verification ---------------------------------------------------------------------------
    def _creds(self, key: str, token: str) -> str:
        with self.lock:
            found = self.creds.get(key)
        if found is None:
            raise Refused(403, "InvalidAccessKeyId")
        secret, want, expires = found
        if want and token != want:
            raise Refused(403, "InvalidToken")
        if self.now() >= expires:
            self.refused_expired += 1
            raise Refused(400, "ExpiredToken", "The provided token has expired.")
        return secret

    def verify(self, method: str, path: str, query: str, headers: dict[str, str], body: bytes) -> str:
        """Who signed it ("node": header-signed, "presigned", "post"), or Refused."""
        auth = headers.get("authorization", "")
        params = parse_qsl(query, keep_blank_values=True)
        if auth:
            self._verify_header(method, path, params, headers, body, auth)
            key = auth.partition("Credential=")[2].partition("/")[0]
            if self.authorize is not None and not self.authorize(key, method, path, query):
                raise Refused(403, "AccessDenied", "not allowed by the signer's policy")
            return "node"
        if any(k == "X-Amz-Signature" for k, _ in params):
            self._verify_query(method, path, params, headers)
            return "presigned"
        if method == "POST" and headers.get("content-type", "").startswith("multipart/form-data"):
            self._verify_post(headers, body)
            return "post"
        raise Refused(403, "AccessDenied", "anonymous")

    @staticmethod
    def _canonical(method: str, path: str, params: list[tuple[str, str]], headers: dict[str, str], names: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in sorted((_q(k), _q(v)) for k, v in params))
        lines = "".join(f"{n}:{' '.join(headers.get(n, '').split())}\n" for n in names.split(";"))
        return "\n".join([method, path, query, lines, names])

    def _check(self, canonical: str, payload: str, stamp: str, scope: str, secret: str, signature: str) -> None:
        date, region = scope.split("/")[0], scope.split("/")[1]
        request = canonical + "\n" + payload
        to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(request.encode()).hexdigest()])
        want = hmac.new(signing_key(secret, date, region), to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, signature):
            raise Refused(403, "SignatureDoesNotMatch")

    def _verify_header(
        self, method: str, path: str, params: list[tuple[str, str]], headers: dict[str, str], body: bytes, auth: str
    ) -> None:
        algo, _, rest = auth.partition(" ")
        fields = dict(p.strip().split("=", 1) for p in rest.split(",") if "=" in p)
        if algo != "AWS4-HMAC-SHA256" or not {"Credential", "SignedHeaders", "Signature"} <= set(fields):
            raise Refused(400, "AuthorizationHeaderMalformed")
        key, _, scope = fields["Credential"].partition("/")
        stamp = headers.get("x-amz-date", "")
        if not stamp or abs(_amz_time(stamp) - self.now()) > SKEW_S:
            raise Refused(403, "RequestTimeTooSkewed")
        secret = self._creds(key, headers.get("x-amz-security-token", ""))
        payload = headers.get("x-amz-content-sha256", "")
        if payload != "UNSIGNED-PAYLOAD" and payload != hashlib.sha256(body).hexdigest():
            raise Refused(400, "XAmzContentSHA256Mismatch")
        names = fields["SignedHeaders"]
        if "host" not in names.split(";"):
            raise Refused(403, "SignatureDoesNotMatch", "host not signed")
        self._check(
            self._canonical(method, path, params, headers, names), payload, stamp, scope, secret, fields["Signature"]
        )

    def _verify_query(self, method: str, path: str, params: list[tuple[str, str]], headers: dict[str, str]) -> None:
        p = dict(params)
        stamp = p.get("X-Amz-Date", "")
        if not stamp or self.now() > _amz_time(stamp) + int(p.get("X-Amz-Expires", "0")):
            self.refused_expired += 1
            raise Refused(403, "AccessDenied", "Request has expired")
        key, _, scope = p.get("X-Amz-Credential", "").partition("/")
        secret = self._creds(key, p.get("X-Amz-Security-Token", ""))
        rest = [(k, v) for k, v in params if k != "X-Amz-Signature"]
        canonical = self._canonical(method, path, rest, headers, p.get("X-Amz-SignedHeaders", "host"))
        self._check(canonical, "UNSIGNED-PAYLOAD", stamp, scope, secret, p["X-Amz-Signature"])

    def _verify_post(self, headers: dict[str, str], body: bytes) -> None:
        head = f"Content-Type: {headers['content-type']}\r\n\r\n".encode()
        msg = BytesParser().parsebytes(head + body)
        form: dict[str, str] = {}
        for part in msg.get_payload() if msg.is_multipart() else []:
            name = part.get_param("name", header="content-disposition")
            if name and name != "file":
                form[str(name).lower()] = (part.get_payload(decode=True) or b"").decode()
        policy = form.get("policy", "")
        try:
            doc = json.loads(base64.b64decode(policy))
            ends = float(timegm(time.strptime(doc["expiration"][:19], "%Y-%m-%dT%H:%M:%S")))
        except (ValueError, KeyError, TypeError):
            raise Refused(400, "InvalidPolicyDocument") from None
        if self.now() > ends:
            self.refused_expired += 1
            raise Refused(403, "AccessDenied", "Invalid according to Policy: Policy expired.")
        key, _, scope = form.get("x-amz-credential", "").partition("/")
        secret = self._creds(key, form.get("x-amz-security-token", ""))
        date, region = scope.split("/")[0], scope.split("/")[1]
        want = hmac.new(signing_key(secret, date, region), policy.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, form.get("x-amz-signature", "")):
            raise Refused(403, "SignatureDoesNotMatch")


class _Handler(BaseHTTPRequestHandler):
    front: StrictS3
    protocol_version = "HTTP/1.1"

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _any(self) -> None:
        target = urlsplit(self.path)
        netloc = target.netloc or self.headers.get("Host", "")
        path = target.path or "/"
        body = self._body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        who = "pass"
        if netloc == urlsplit(self.front.base).netloc:  # addressed as the endpoint itself, not as a proxy
            netloc = self.front.upstream
        if netloc == self.front.upstream:
            try:
                who = self.front.verify(self.command, path, target.query, headers, body)
            except Refused as exc:
                self.front.record(self.command, path, exc.status, "refused")
                return self._send(exc.status, f"<Error><Code>{exc.code}</Code><Message>{exc.why}</Message></Error>")
        conn = http.client.HTTPConnection(netloc, timeout=60)
        try:
            send = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            send["Content-Length"] = str(len(body))
            conn.request(self.command, path + (f"?{target.query}" if target.query else ""), body=body, headers=send)
            resp = conn.getresponse()
            data = resp.read()
            if who != "pass":
                self.front.record(self.command, path, resp.status, who)
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in HOP and k.lower() != "content-length":
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            conn.close()

    def _send(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass
