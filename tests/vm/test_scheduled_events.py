"""Azure Scheduled Events: the first call may take up to 2 minutes while the service starts
(Microsoft's Scheduled Events doc). The fake IMDS here answers its first call only after a start-up
time, and only to a caller that waits for it (a call cut short leaves the service still starting);
the start-up is 3 s instead of minutes. A guard that polled only with 2 s timeouts would never see
the eviction notice."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.vm_boot import make_vm

STARTUP_S = 3.0


class _SlowStartImds(BaseHTTPRequestHandler):
    started = False
    first_calls = 0

    def _client_gone(self) -> bool:
        try:
            return self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False

    def _reply(self, code: int, body: bytes = b"") -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_DELETE(self) -> None:  # the VM's self-delete of its resource group
        self._reply(202)

    def do_GET(self) -> None:
        if self.path.startswith("/metadata/identity/oauth2/token?"):
            return self._reply(200, b'{"access_token": "t"}')
        if self.path.startswith("/metadata/instance/compute?"):
            return self._reply(200, b'{"subscriptionId": "s", "resourceGroupName": "rg"}')
        if not self.path.startswith("/metadata/scheduledevents?") or self.headers.get("Metadata") != "true":
            return self._reply(404)
        if not type(self).started:
            type(self).first_calls += 1
            end = time.monotonic() + STARTUP_S
            while time.monotonic() < end:
                if self._client_gone():
                    return  # cut short: the service is still starting
                time.sleep(0.05)
            type(self).started = True
        events = [
            {
                "EventId": "e1",
                "EventType": "Preempt",
                "ResourceType": "VirtualMachine",
                "Resources": ["vm0"],
                "EventStatus": "Scheduled",
            }
        ]
        self._reply(200, json.dumps({"DocumentIncarnation": 2, "Events": events}).encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def slow_imds() -> Iterator[str]:
    _SlowStartImds.started, _SlowStartImds.first_calls = False, 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowStartImds)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_first_scheduled_events_call_is_waited_for(tmp_path: Path, slow_imds: str) -> None:
    vm = make_vm(
        tmp_path,
        provider="azure",
        gpu="K80",
        run="echo started; sleep 20",
        stub_env={
            "STUB_GPU_NAME": "Tesla K80",
            "STUB_DRIVER": "470.82.01",
            "GPUCLOUD_IMDS_ENDPOINT": slow_imds,
            "GPUCLOUD_AZURE_ARM_ENDPOINT": slow_imds,
        },
    ).start()
    vm.wait(60)
    status = vm.status()
    assert status["state"] == "preempted" and "Scheduled Events: Preempt" in status["message"], status
    assert _SlowStartImds.started
