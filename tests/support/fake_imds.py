"""A fake instance metadata service (IMDS) of both clouds, enough for the node's spot guard: AWS's
token and spot/instance-action, Azure's scheduled events and what Azure's self-delete asks."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.aws_sim import http_reply


class FakeImds(BaseHTTPRequestHandler):
    """IMDS of both clouds, enough for the guard: AWS token + spot/instance-action (404 until
    preempted), Azure scheduledevents (+ the token/compute/DELETE of Azure's self-delete)."""

    preempted = False
    seen: list[str] = []

    def _reply(self, code: int, body: str) -> None:
        http_reply(self, code, body)

    def do_PUT(self) -> None:  # noqa: N802
        self.seen.append(f"PUT {self.path}")
        ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self._reply(200 if ok else 400, "tok-1" if ok else "")

    def do_GET(self) -> None:  # noqa: N802
        self.seen.append(f"GET {self.path}")
        if self.path == "/latest/meta-data/spot/instance-action":
            ok = self.preempted and self.headers.get("X-aws-ec2-metadata-token") == "tok-1"
            self._reply(200 if ok else 404, '{"action": "terminate", "time": "2026-12-03T08:00:00Z"}' if ok else "")
        elif self.path.startswith("/metadata/scheduledevents?") and self.headers.get("Metadata") == "true":
            events = (
                [
                    {
                        "EventId": "e1",
                        "EventType": "Preempt",
                        "ResourceType": "VirtualMachine",
                        "Resources": ["vm0"],
                        "EventStatus": "Scheduled",
                    }
                ]
                if self.preempted
                else []
            )
            self._reply(200, json.dumps({"DocumentIncarnation": 2 if events else 1, "Events": events}))
        elif self.path.startswith("/metadata/identity/oauth2/token?"):
            self._reply(200, '{"access_token": "t"}')
        elif self.path.startswith("/metadata/instance/compute?"):
            self._reply(200, '{"subscriptionId": "s", "resourceGroupName": "rg"}')
        else:
            self._reply(404, "")

    def do_DELETE(self) -> None:  # noqa: N802
        self._reply(202, "")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def imds() -> Iterator[type[FakeImds]]:
    """The service on a free local port (`.url`), nobody preempted yet; shut down after the test."""
    FakeImds.preempted, FakeImds.seen = False, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeImds)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    FakeImds.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    yield FakeImds
    server.shutdown()
