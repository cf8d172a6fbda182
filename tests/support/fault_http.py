"""An HTTP front for a FileChannel folder that misbehaves on request: the VM fault matrix's
object store. GET and PUT map `/<key>` to `<root>/<key>`; `hang_puts` makes the first N PUTs hang
(the connection stays open, nothing is read) until the server stops or `hang_s` passes."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def closed_port() -> int:
    """A loopback port with nothing listening: every connection to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class FaultServer:
    """Start with `FaultServer(root).start()`; `url_map` turns the channel's file:// URLs into its own."""

    def __init__(self, root: Path, *, hang_puts: int = 0, hang_s: float = 600.0) -> None:
        self.root = Path(root).resolve()
        self.hang_puts = hang_puts
        self.hang_s = hang_s
        self.puts = 0
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _path(self) -> Path:
                path = (server.root / self.path.lstrip("/").split("?", 1)[0]).resolve()
                if server.root not in path.parents:
                    raise PermissionError(self.path)
                return path

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                try:
                    data = self._path().read_bytes()
                except (OSError, PermissionError):
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:  # noqa: N802
                with server.lock:
                    server.puts += 1
                    hang = server.puts <= server.hang_puts
                if hang:
                    server.stopping.wait(server.hang_s)
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = self._path()
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(path.name + ".part")
                tmp.write_bytes(body)
                tmp.replace(path)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> FaultServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def url_map(self, url: str) -> str:
        prefix = self.root.as_uri()
        return self.base + url[len(prefix) :] if url.startswith(prefix) else url
