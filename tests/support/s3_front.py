"""A front before a test object store that answers as S3 does where moto cannot (docs/PROVIDERS.md,
"S3 endpoints"): `307 TemporaryRedirect` with a Location on the bucket's regional host for the
first `redirects` requests of each object (S3's global name while DNS catches up, hours after a
bucket is made), or `400 IllegalLocationConstraintException` for every request (`wrong_region`: a
region launched after 2019-03-20 asked on another region's name); then what the store says. `only`
limits the faults to some requests (method, path).

The store is a folder (a FileChannel's root: GET and PUT map `/<key>` to `<root>/<key>`, as in
tests/support/fault_http.py) or an HTTP server such as moto (`upstream`), to which a request passes
as it came: method, path, query, headers and body. Before an HTTP store only the node's requests
are faulted (presigned: `X-Amz-Signature` in the query, a POST form, or curl's own signed request:
the node's role); the CLI's own signed calls (botocore) pass, as botocore follows S3's redirects
itself. Every answer is kept in `answers`.

    front = S3Front(tmp / "channel", redirects=2).start()   # or S3Front(upstream=moto.endpoint)
    url = front.url_map(url)                                 # file:// or upstream URL -> the front
"""

from __future__ import annotations

import http.client
import threading
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

REGIONAL_HOST = "{bucket}.s3.{region}.amazonaws.com"
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "host"}


class S3Front:
    """Start with `.start()`, end with `.stop()`; `answers` lists (method, path, code)."""

    def __init__(
        self,
        root: Path | None = None,
        *,
        upstream: str = "",
        redirects: int = 0,
        wrong_region: bool = False,
        region: str = "ap-east-1",
        bucket: str = "gpucloud-123456789012-ap-east-1",
        only: Callable[[str, str], bool] | None = None,
    ) -> None:
        if (root is None) == (not upstream):
            raise ValueError("a folder or an upstream URL, one of them")
        self.root = Path(root).resolve() if root is not None else None
        self.upstream = upstream.rstrip("/")
        self.redirects = redirects
        self.wrong_region = wrong_region
        self.location = "https://" + REGIONAL_HOST.format(bucket=bucket, region=region)
        self.region = region
        self.only = only  # (method, path) -> whether the faults apply; None: every node request
        self.seen: Counter[str] = Counter()
        self.answers: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> S3Front:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def url_map(self, url: str) -> str:
        """The store's URL (file:// under the folder, or the upstream's) as one through the front."""
        prefix = self.root.as_uri() if self.root is not None else self.upstream
        return self.base + url[len(prefix) :] if url.startswith(prefix) else url

    def codes(self, path_end: str = "", method: str = "") -> list[int]:
        """The codes answered so far, for paths ending with `path_end` (and that method)."""
        with self.lock:
            return [c for m, path, c in self.answers if path.endswith(path_end) and method in ("", m)]

    def fault(self, method: str, path: str, query: str, content_type: str, agent: str = "") -> int:
        """307 / 400 for this request, or 0 to let it through to the store. The node's requests:
        presigned, a POST form, or signed by the node itself (its curl, never botocore)."""
        node = (
            self.root is not None
            or "X-Amz-Signature=" in query
            or content_type.startswith("multipart/form-data")
            or agent.startswith("curl/")
        )
        if not node or (self.only is not None and not self.only(method, path)):
            return 0
        if self.wrong_region:
            return 400
        with self.lock:
            self.seen[path] += 1
            return 307 if self.seen[path] <= self.redirects else 0


class _Handler(BaseHTTPRequestHandler):
    """The front's requests; `front` is set on a subclass made per front (_handler)."""

    front: S3Front
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _answer(self, code: int, body: bytes = b"", headers: list[tuple[str, str]] | None = None) -> None:
        with self.front.lock:
            self.front.answers.append((self.command, urlsplit(self.path).path, code))
        self.send_response(code)
        for name, value in headers or []:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _serve(self) -> None:
        parts = urlsplit(self.path)
        body = self._body()  # read before any answer: a client still sending would see a reset
        code = self.front.fault(
            self.command,
            parts.path,
            parts.query,
            self.headers.get("Content-Type") or "",
            self.headers.get("User-Agent") or "",
        )
        if code == 307:
            where = f"{self.front.location}{parts.path}?{parts.query}"  # never to be followed: the signed host
            xml = f"<Error><Code>TemporaryRedirect</Code><Endpoint>{self.front.location[8:]}</Endpoint></Error>"
            self._answer(307, xml.encode(), [("Location", where), ("x-amz-bucket-region", self.front.region)])
        elif code == 400:
            xml = (
                "<Error><Code>IllegalLocationConstraintException</Code><Message>The "
                f"{self.front.region} location constraint is incompatible for the region specific "
                "endpoint this request was sent to.</Message></Error>"
            )
            self._answer(400, xml.encode(), [("x-amz-bucket-region", self.front.region)])
        elif self.front.root is not None:
            self._folder(parts.path, body)
        else:
            self._proxy(body)

    def _folder(self, path: str, body: bytes) -> None:
        assert self.front.root is not None
        target = (self.front.root / path.lstrip("/")).resolve()
        if self.front.root not in target.parents:
            self._answer(403)
        elif self.command == "PUT":
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".part")
            tmp.write_bytes(body)
            tmp.replace(target)
            self._answer(200)
        elif self.command in ("GET", "HEAD") and target.is_file():
            self._answer(200, target.read_bytes())
        else:
            self._answer(404)

    def _proxy(self, body: bytes) -> None:
        up = urlsplit(self.front.upstream)
        conn = http.client.HTTPConnection(up.hostname or "127.0.0.1", up.port or 80, timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
            headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            got = conn.getresponse()
            data = got.read()
            keep = [(k, v) for k, v in got.getheaders() if k.lower() not in HOP_HEADERS | {"content-length"}]
            self._answer(got.status, data, keep)
        finally:
            conn.close()

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _serve  # noqa: N815 (http.server's naming)


def _handler(front: S3Front) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"front": front})
