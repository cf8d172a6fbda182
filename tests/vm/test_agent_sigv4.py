"""The agent's own S3 signature (gpucloud/vm/agent/sigv4.py) against the strict SigV4 front
(tests/support/s3_sigv4.py): its requests pass, tampered or expired ones are refused, presigned
URLs die at their expiry and with their credentials, and IMDS credentials are refreshed before
they expire."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpucloud.vm.agent.sigv4 import Credentials, ImdsCredentials, Signer, sign
from gpucloud.vm.agent.transfer import Transfer
from tests.support.s3_sigv4 import StrictS3

NODE = Credentials("ASIANODE", "node-secret", "node-token", time.time() + 3600)


class _Store(BaseHTTPRequestHandler):
    """The upstream: keeps PUT bodies by path, answers GET with them (or 404)."""

    objects: dict[str, bytes] = {}
    protocol_version = "HTTP/1.1"

    def _reply(self, code: int, body: bytes = b"") -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self) -> None:  # noqa: N802
        self.objects[self.path.split("?")[0]] = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._reply(200)

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._reply(204)

    def do_GET(self) -> None:  # noqa: N802
        body = self.objects.get(self.path.split("?")[0])
        self._reply(200, body) if body is not None else self._reply(404)

    def log_message(self, *args: object) -> None:
        pass


class _Fixed:
    def __init__(self, creds: Credentials | None) -> None:
        self.creds = creds

    def get(self) -> Credentials | None:
        return self.creds


@pytest.fixture
def front(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[StrictS3, str]]:
    store = ThreadingHTTPServer(("127.0.0.1", 0), type("S", (_Store,), {"objects": {}}))
    threading.Thread(target=store.serve_forever, daemon=True).start()
    upstream = f"http://127.0.0.1:{store.server_address[1]}"
    strict = StrictS3(upstream).start()
    strict.register(NODE.access_key, NODE.secret_key, NODE.token, NODE.expires)
    strict.register("AKIACLI", "cli-secret", "", time.time() + 600)
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, strict.base)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    try:
        yield strict, upstream
    finally:
        strict.stop()
        store.shutdown()


def presign(upstream: str, key: str, method: str = "get_object", expires: int = 300) -> str:
    import boto3
    from botocore.config import Config

    s3 = boto3.client(
        "s3",
        region_name="eu-west-1",
        endpoint_url=upstream,
        aws_access_key_id="AKIACLI",
        aws_secret_access_key="cli-secret",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )
    return str(s3.generate_presigned_url(method, Params={"Bucket": "b", "Key": key}, ExpiresIn=expires))


def curl(url: str, headers: list[str], method: str = "GET") -> int:
    args = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", method]
    for h in headers:
        args += ["-H", h]
    return int(subprocess.run([*args, url], capture_output=True, text=True, timeout=30).stdout or 0)


def test_agent_signed_requests_pass_and_tampered_ones_fail(front: tuple[StrictS3, str], tmp_path: Path) -> None:
    strict, upstream = front
    part = tmp_path / "part"
    part.write_bytes(b"log bytes")
    transfer = Transfer()
    transfer.signer = Signer(_Fixed(NODE))  # type: ignore[arg-type]
    url = presign(upstream, "runs/r/node-0/log/000000", "put_object")
    assert transfer.put_file(url, part) and strict.signed_by_node == 1
    assert transfer.get(presign(upstream, "runs/r/node-0/log/000000")) == b"log bytes"

    target, headers = sign("GET", f"{upstream}/b/runs/r/x?list-type=2&prefix=runs/r/", NODE, "eu-west-1", time.time())
    assert curl(target, headers) == 404  # signed right: the store answers (nothing there)
    bad_sig = [h[:-1] + ("0" if h[-1] != "0" else "1") if h.startswith("Authorization") else h for h in headers]
    assert curl(target, bad_sig) == 403
    assert curl(target.replace("/runs/r/x", "/runs/other/x"), headers) == 403  # another object
    assert curl(target, headers, method="DELETE") == 403  # another method
    wrong_token = [h if not h.startswith("x-amz-security-token") else "x-amz-security-token: forged" for h in headers]
    assert curl(target, wrong_token) == 403
    stale, stale_headers = sign("GET", f"{upstream}/b/k", NODE, "eu-west-1", time.time() - 3600)
    assert curl(stale, stale_headers) == 403  # RequestTimeTooSkewed
    strict.advance(3600)  # the node's credentials expired
    assert curl(target, headers[:1] + sign("GET", target, NODE, "eu-west-1", strict.now())[1][1:]) in (400, 403)
    assert [c for _, _, c, who in strict.answers if who == "refused"].count(400) >= 1


def test_presigned_urls_die_at_their_expiry_and_with_their_credentials(front: tuple[StrictS3, str]) -> None:
    strict, upstream = front
    assert curl(presign(upstream, "k"), []) == 404  # valid: the store answers
    url = presign(upstream, "k")
    assert curl(url.replace("X-Amz-Signature=", "X-Amz-Signature=0"), []) == 403
    assert curl(presign(upstream, "k", expires=60), []) == 404
    strict.advance(120)
    assert curl(presign(upstream, "k", expires=1), []) in (403,)  # signed now... expired by the front's clock
    assert curl(url, []) == 404  # 300 s URL, 120 s on: still good
    strict.advance(500)  # past the CLI's credentials (600 s): every URL they signed is dead
    assert curl(presign(upstream, "k", expires=3600), []) == 400
    assert curl(f"{upstream}/b/k", []) == 403  # unsigned


def test_transfer_falls_back_to_the_presigned_url_when_the_role_cannot(
    front: tuple[StrictS3, str], tmp_path: Path
) -> None:
    strict, upstream = front
    part = tmp_path / "part"
    part.write_bytes(b"x")
    transfer = Transfer()
    transfer.signer = Signer(_Fixed(Credentials("ASIAUNKNOWN", "s", "t", time.time() + 3600)))  # type: ignore[arg-type]
    assert transfer.put_file(presign(upstream, "runs/r/a", "put_object"), part)
    assert [who for _, _, _, who in strict.answers] == ["refused", "presigned"]
    transfer.signer = Signer(_Fixed(None))  # type: ignore[arg-type]  # IMDS has none yet: presigned at once
    assert transfer.put_file(presign(upstream, "runs/r/b", "put_object"), part)
    assert [who for _, _, _, who in strict.answers][-1] == "presigned"


def test_a_log_post_goes_as_the_nodes_own_put(front: tuple[StrictS3, str], tmp_path: Path) -> None:
    strict, upstream = front
    part = tmp_path / "part"
    part.write_bytes(b"line\n")
    transfer = Transfer()
    transfer.signer = Signer(_Fixed(NODE))  # type: ignore[arg-type]
    fields = [("x-amz-credential", "AKIACLI/20260101/eu-west-1/s3/aws4_request"), ("policy", "e30=")]
    assert transfer.post_form(f"{upstream}/b", fields, "runs/r/node-0/log/000001", part)
    assert strict.answers[-1][:2] == ("PUT", "/b/runs/r/node-0/log/000001") and strict.answers[-1][3] == "node"


def test_imds_credentials_are_refreshed_before_they_expire() -> None:
    now = [1000.0]
    calls: list[str] = []
    docs = iter(
        [
            b'{"Code":"Success","AccessKeyId":"A1","SecretAccessKey":"s","Token":"t",'
            b'"Expiration":"1970-01-01T00:33:20Z"}',  # 2000
            None,
            b'{"Code":"Success","AccessKeyId":"A2","SecretAccessKey":"s","Token":"t",'
            b'"Expiration":"1970-01-01T01:00:00Z"}',  # 3600
        ]
    )

    def request(method: str, url: str, headers: list[str], max_time: float = 0) -> bytes | None:
        calls.append(url.rsplit("/", 1)[-1] or "list")
        if method == "PUT":
            return b"tok"
        if url.endswith("security-credentials/"):
            return b"gpucloud-node-abc\n"
        return next(docs)

    creds = ImdsCredentials(request, "http://imds", now=lambda: now[0])
    first = creds.get()
    assert first is not None and first.access_key == "A1"
    now[0] = 1600.0  # 400 s left: kept
    assert creds.get() == first and creds.fetches == 1
    now[0] = 1701.0  # under 5 minutes left: read again; IMDS fails, the old ones still serve
    assert creds.get() == first and creds.fetches == 2
    now[0] = 1705.0  # within 10 s of the failure: IMDS is not asked again
    assert creds.get() == first and creds.fetches == 2
    now[0] = 1712.0
    again = creds.get()
    assert again is not None and again.access_key == "A2" and creds.fetches == 3
    assert "gpucloud-node-abc" in calls


def test_a_role_refusing_a_missing_object_is_not_there_yet_and_a_refused_put_falls_back_quietly(
    front: tuple[StrictS3, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """S3 answers 403 for a missing object to a role without s3:ListBucket: a GET whose 404 is an
    ordinary answer (a notice, a peer's ready) takes it as not there yet, without a second request;
    a log part's own PUT that the role may not make goes as the POST form, with no console line."""
    strict, upstream = front
    part = tmp_path / "part"
    part.write_bytes(b"x")
    transfer = Transfer()
    transfer.signer = Signer(_Fixed(Credentials("ASIAUNKNOWN", "s", "t", time.time() + 3600)))  # type: ignore[arg-type]
    assert transfer.get(presign(upstream, "runs/r/node-0/notice")) is None
    assert [who for _, _, _, who in strict.answers] == ["refused"]
    fields = [("x-amz-credential", "AKIACLI/20260101/eu-west-1/s3/aws4_request"), ("policy", "e30=")]
    transfer.post_form(f"{upstream}/b", fields, "runs/r/node-0/log/000001", part)
    assert [who for _, _, _, who in strict.answers][1:2] == ["refused"]
    assert "HTTP 403" not in capsys.readouterr().err
