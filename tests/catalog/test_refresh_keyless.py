"""A plain `catalog refresh` (no --cloud) prices Azure from the public Retail Prices API without
Azure credentials, exactly as `catalog refresh --cloud azure` does: one command refreshes what can
be refreshed here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpucloud.catalog import load_catalog
from gpucloud.catalog.prices import price_source
from gpucloud.catalog.refresh import refresh
from tests.support.fake_prices import FakeAzure, azure_item, azure_sku


@pytest.fixture
def azure(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAzure]:
    """The public price API only (its SKUs API is there to show it is never asked)."""
    fake = FakeAzure(
        skus=[azure_sku("Standard_NC4as_T4_v3", ["eastus"], 1, 4, 28)],
        items=[
            azure_item("Standard_NC4as_T4_v3", "eastus", 0.526),
            azure_item("Standard_NC4as_T4_v3", "eastus", 0.0627, spot=True),
        ],
    ).start()
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    for key in ("GPUCLOUD_AZURE_ARM_ENDPOINT", "AZURE_SUBSCRIPTION_ID", "IDENTITY_ENDPOINT", "IDENTITY_HEADER"):
        monkeypatch.delenv(key, raising=False)
    yield fake
    fake.stop()


def test_a_plain_refresh_includes_the_keyless_azure_prices(azure: FakeAzure, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    report = refresh()  # no clouds named
    info = report.clouds["azure"]
    assert info["refreshed"] and "no credentials found" in info["problems"][0]  # type: ignore[index]
    assert not any("/subscriptions/" in r for r in azure.requests)  # prices only: no ARM call
    t4 = next(
        o
        for o in load_catalog().offerings
        if o.cloud == "azure" and (o.instance_type, o.region) == ("Standard_NC4as_T4_v3", "eastus")
    )
    assert (t4.price_per_hour, t4.spot_price_per_hour) == (0.526, 0.0627)
    assert price_source(t4).kind == "live"
    assert not report.clouds["aws"]["refreshed"]  # no AWS credentials: kept, named
