"""An endpoint that is down: nothing listens (connections refused), or a socket that completes the
TCP handshake and never answers (what a hung server or a half-open proxy looks like)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def dead_endpoint(kind: str) -> Iterator[str]:
    """`http://127.0.0.1:<port>` that is "refused" or "silent" for as long as the block runs."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    if kind == "silent":
        server.listen(16)  # the kernel completes the handshake; nobody ever accepts or answers
    else:
        server.close()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
