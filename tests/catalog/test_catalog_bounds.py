"""`gpucloud catalog refresh` ends in bounded time against hostile price servers (docs/CATALOG.md,
"Bounds"): one that answers a byte a second, a Price List whose page token never repeats, a
Retail Prices API whose NextPageLink never ends. Each is reported as not refreshed (partial),
never as complete. Through the real CLI."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

import pytest

from gpucloud.catalog import load_catalog
from tests.support.cli import ci_env, cli
from tests.support.fake_prices import FakeAwsPricing, FakeAzure, aws_product, azure_item, azure_sku
from tests.support.moto_server import Moto, moto, moto_server  # noqa: F401

REPO = Path(__file__).resolve().parents[2]


def timed_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> tuple[subprocess.CompletedProcess[str], float]:
    """The CLI run from the checkout with CI set, and how long it took (the bounds are in seconds)."""
    t0 = time.monotonic()
    out = cli(*args, env=ci_env(**(env or {})), cwd=REPO, timeout=timeout)
    return out, time.monotonic() - t0


class Trickle:
    """An HTTP server on 127.0.0.1 that sends its answer one byte a second (headers included)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/api/retail/prices"
        self.stopped = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        body = json.dumps({"Items": [], "NextPageLink": None}).encode() * 1000
        answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        with conn:
            conn.recv(65536)
            for byte in answer:
                if self.stopped.is_set():
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(1)

    def stop(self) -> None:
        self.stopped.set()
        self.sock.close()


@pytest.fixture
def azure_skus(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAzure]:
    fake = FakeAzure(
        skus=[azure_sku("Standard_NC4as_T4_v3", ["eastus"], 1, 4, 28)],
        items=[azure_item("Standard_NC4as_T4_v3", "eastus", 0.526)],
    ).start()
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    yield fake
    fake.stop()


def test_a_price_server_answering_one_byte_a_second_is_given_up_at_the_deadline(azure_skus: FakeAzure) -> None:
    trickle = Trickle()
    try:
        out, took = timed_cli(
            "catalog",
            "refresh",
            "--cloud",
            "azure",
            "--json",
            env={"GPUCLOUD_AZURE_PRICES_URL": trickle.url, "GPUCLOUD_CATALOG_DEADLINE": "5"},
        )
    finally:
        trickle.stop()
    assert took < 30, f"refresh took {took:.0f} s against a 1 byte/s server"
    assert out.returncode == 75, out.stderr
    doc = json.loads(out.stdout)["error"]
    assert "no complete answer within" in doc["message"] and "GPUCLOUD_CATALOG_DEADLINE" in doc["message"], doc
    assert "unchanged" in doc["message"]
    assert load_catalog().meta.origin == "shipped"  # nothing half-written


def test_a_trickling_price_list_ends_the_aws_source_at_the_deadline(
    moto: Moto, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: F811
    """botocore's read timeout (30 s per read) never fires against one byte a second either."""
    trickle = Trickle()
    monkeypatch.setenv("GPUCLOUD_AWS_PRICING_URL", trickle.url.removesuffix("/api/retail/prices"))
    try:
        out, took = timed_cli(
            "catalog",
            "refresh",
            "--cloud",
            "aws",
            "--region",
            "us-east-1",
            "--json",
            env={"GPUCLOUD_CATALOG_DEADLINE": "6"},
        )
    finally:
        trickle.stop()
    assert took < 40, f"refresh took {took:.0f} s against a 1 byte/s Price List"
    assert out.returncode == 75, out.stderr
    message = json.loads(out.stdout)["error"]["message"]
    assert "GPUCLOUD_CATALOG_DEADLINE" in message and "unchanged" in message, message


class EndlessToken(FakeAwsPricing):
    """A Price List whose NextToken is new on every page: botocore's repeated-token check never fires."""

    def post(self, handler: Any, body: dict[str, Any]) -> tuple[int, Any]:
        status, doc = super().post(handler, {**body, "NextToken": None})
        doc["NextToken"] = f"{len(self.requests)}"
        return status, doc


def test_an_endless_page_token_stops_at_the_page_limit_and_is_reported(
    moto: Moto, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: F811
    fake = EndlessToken(products=[aws_product("g4dn.xlarge", "us-east-1", 0.526)]).start()
    monkeypatch.setenv("GPUCLOUD_AWS_PRICING_URL", fake.url)
    try:
        out, took = timed_cli(
            "catalog",
            "refresh",
            "--cloud",
            "aws",
            "--region",
            "us-east-1",
            "--json",
            env={"GPUCLOUD_CATALOG_MAX_PAGES": "20"},
        )
    finally:
        fake.stop()
    assert out.returncode == 75, out.stderr
    message = json.loads(out.stdout)["error"]["message"]
    assert f"Price List at {fake.url}" in message and "more than 20 pages" in message, message
    assert "GPUCLOUD_CATALOG_MAX_PAGES" in message
    assert len(fake.requests) <= 21, len(fake.requests)
    assert took < 60


class EndlessLink(FakeAzure):
    """A Retail Prices API whose NextPageLink never ends (empty pages after the first)."""

    def _prices(self, query: dict[str, list[str]]) -> dict[str, Any]:
        skip = int(query.get("$skip", ["0"])[0])
        doc = super()._prices(query) if skip == 0 else {"Items": [], "Count": 0}
        doc["NextPageLink"] = (
            f"{self.url}/api/retail/prices?{urlencode({'$filter': query['$filter'][0], '$skip': skip + 1})}"
        )
        return doc


def test_an_endless_next_page_link_is_partial_never_complete(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = EndlessLink(
        skus=[azure_sku("Standard_NC4as_T4_v3", ["eastus"], 1, 4, 28)],
        items=[azure_item("Standard_NC4as_T4_v3", "eastus", 0.526)],
    ).start()
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    try:
        out, _ = timed_cli("catalog", "refresh", "--json", env={"GPUCLOUD_CATALOG_MAX_PAGES": "30"})
    finally:
        fake.stop()
    pages = sum(urlparse(r).path == "/api/retail/prices" for r in fake.requests)
    assert pages <= 31, pages
    doc = json.loads(out.stdout)
    problems = doc["clouds"]["azure"]["problems"] if "clouds" in doc else [doc["error"]["message"]]
    assert any("Retail Prices API at" in p and "more than 30 pages" in p for p in problems), problems
    assert doc.get("complete") is not True
    assert "error" in doc or not doc["clouds"]["azure"]["refreshed"]
    assert all(parse_qs(urlparse(r).query).get("$skip", ["0"])[0] != "31" for r in fake.requests)


def test_a_malformed_bound_is_a_clear_error() -> None:
    out, _ = timed_cli("catalog", "refresh", "--json", env={"GPUCLOUD_CATALOG_DEADLINE": "soon"})
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "GPUCLOUD_CATALOG_DEADLINE='soon' is not a positive number" in json.loads(out.stdout)["error"]["message"]
