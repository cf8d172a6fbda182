"""Local HTTP servers playing the public price APIs for `catalog refresh` tests.

- `FakeAwsPricing`: the Price List Query API (`AWSPriceListService.GetProducts`, JSON 1.1), paged
  with NextToken, answering TERM_MATCH filters over a list of products.
- `FakeAzure`: the Retail Prices API (`GET /api/retail/prices?$filter=...`, pages linked by
  NextPageLink) and, on the same port, the ARM Resource SKUs list plus an App Service managed-
  identity endpoint, so that azure-identity and azure-mgmt-compute reach it with no test code in
  the product.
Each can be told to fail (`down = True`): every request then gets HTTP 503.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

IDENTITY_HEADER = "fake-prices-identity"


def aws_product(instance_type: str, region: str, usd: float, **attrs: str) -> dict[str, Any]:
    """One Price List product as the Query API returns it (inside a JSON string)."""
    attributes = {
        "instanceType": instance_type,
        "regionCode": region,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "instanceFamily": "GPU instance",
        **attrs,
    }
    return {
        "product": {"attributes": attributes},
        "terms": {"OnDemand": {"T1": {"priceDimensions": {"D1": {"unit": "Hrs", "pricePerUnit": {"USD": f"{usd}"}}}}}},
    }


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


@dataclass
class _Base:
    down: bool = False
    requests: list[str] = field(default_factory=list)
    _server: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> Any:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, doc: Any, ctype: str = "application/json") -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                owner.requests.append(self.path)
                if owner.down and not self.path.startswith("/_identity"):
                    return self._send(503, {"error": {"code": "ServiceUnavailable", "message": "down"}})
                status, doc = owner.get(self)
                self._send(status, doc)

            def do_POST(self) -> None:
                owner.requests.append(self.path)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if owner.down:
                    return self._send(
                        503, {"__type": "ServiceUnavailable", "message": "down"}, "application/x-amz-json-1.1"
                    )
                status, doc = owner.post(self, body)
                self._send(status, doc, "application/x-amz-json-1.1")

        self._server = _Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def get(self, handler: Any) -> tuple[int, Any]:
        return 404, {}

    def post(self, handler: Any, body: dict[str, Any]) -> tuple[int, Any]:
        return 404, {}


@dataclass
class FakeAwsPricing(_Base):
    products: list[dict[str, Any]] = field(default_factory=list)
    page_size: int = 2

    def post(self, handler: Any, body: dict[str, Any]) -> tuple[int, Any]:
        wanted = {f["Field"]: f["Value"] for f in body.get("Filters", [])}
        hits = [p for p in self.products if all(p["product"]["attributes"].get(k) == v for k, v in wanted.items())]
        start = int(body.get("NextToken") or 0)
        page = hits[start : start + self.page_size]
        doc: dict[str, Any] = {"FormatVersion": "aws_v1", "PriceList": [json.dumps(p) for p in page]}
        if start + self.page_size < len(hits):
            doc["NextToken"] = str(start + self.page_size)
        return 200, doc


@dataclass
class FakeAzure(_Base):
    """`items`: Retail Prices rows; `skus`: Resource SKUs (ARM JSON shape)."""

    items: list[dict[str, Any]] = field(default_factory=list)
    skus: list[dict[str, Any]] = field(default_factory=list)
    page_size: int = 3

    def get(self, handler: Any) -> tuple[int, Any]:
        parsed = urlparse(handler.path)
        query = parse_qs(parsed.query)
        if parsed.path == "/_identity":
            return 200, {
                "access_token": "fake-token",
                "expires_on": str(int(time.time()) + 3600),
                "resource": "https://management.azure.com",
                "token_type": "Bearer",
            }
        if parsed.path.endswith("/providers/Microsoft.Compute/skus"):
            return 200, {"value": self.skus}
        if parsed.path == "/api/retail/prices":
            return 200, self._prices(query)
        return 404, {"error": {"code": "NotFound", "message": parsed.path}}

    def _prices(self, query: dict[str, list[str]]) -> dict[str, Any]:
        text = query.get("$filter", [""])[0]
        skus = set(re.findall(r"armSkuName eq '([^']+)'", text))
        hits = [i for i in self.items if not skus or i["armSkuName"] in skus]
        skip = int(query.get("$skip", ["0"])[0])
        page = hits[skip : skip + self.page_size]
        doc: dict[str, Any] = {"Items": page, "Count": len(page), "NextPageLink": None}
        if skip + self.page_size < len(hits):
            query = urlencode({"$filter": text, "$skip": skip + self.page_size})
            doc["NextPageLink"] = f"{self.url}/api/retail/prices?{query}"
        return doc

    def env(self, subscription: str = "00000000-0000-0000-0000-000000000001") -> dict[str, str]:
        return {
            "GPUCLOUD_AZURE_ARM_ENDPOINT": self.url,
            "AZURE_SUBSCRIPTION_ID": subscription,
            "IDENTITY_ENDPOINT": f"{self.url}/_identity",
            "IDENTITY_HEADER": IDENTITY_HEADER,
            "GPUCLOUD_AZURE_PRICES_URL": f"{self.url}/api/retail/prices",
        }


def azure_item(sku: str, region: str, price: float, *, spot: bool = False, windows: bool = False) -> dict[str, Any]:
    name = sku.removeprefix("Standard_").replace("_", " ")
    return {
        "armSkuName": sku,
        "armRegionName": region,
        "retailPrice": price,
        "unitPrice": price,
        "unitOfMeasure": "1 Hour",
        "type": "Consumption",
        "serviceName": "Virtual Machines",
        "skuName": f"{name}{' Spot' if spot else ''}",
        "meterName": f"{name}{' Spot' if spot else ''}",
        "productName": f"Virtual Machines Series{' Windows' if windows else ''}",
        "currencyCode": "USD",
    }


def azure_sku(
    name: str,
    locations: list[str],
    gpus: int,
    vcpus: int,
    memory_gb: float,
    restricted: list[str] | None = None,
    arch: str = "x64",
) -> dict[str, Any]:
    restrictions = [
        {
            "type": "Location",
            "values": [loc],
            "reasonCode": "NotAvailableForSubscription",
            "restrictionInfo": {"locations": [loc]},
        }
        for loc in restricted or []
    ]
    return {
        "resourceType": "virtualMachines",
        "name": name,
        "tier": "Standard",
        "size": name.split("_", 1)[1],
        "family": "fake",
        "locations": locations,
        "locationInfo": [{"location": loc, "zones": []} for loc in locations],
        "capabilities": [
            {"name": "GPUs", "value": str(gpus)},
            {"name": "vCPUs", "value": str(vcpus)},
            {"name": "MemoryGB", "value": str(memory_gb)},
            {"name": "CpuArchitectureType", "value": arch},
        ],
        "restrictions": restrictions,
    }
