"""Azure regions beyond those shipped, without credentials: the keyless `catalog refresh` asks the
public Retail Prices API per size, which answers for every region at once, and adds a known size
in each region where it has a Linux on-demand price (marked as sold there by its price, dated);
`catalog refresh --region R` for a region the catalog lacks works the same way, and a T4 job then
plans there. The shipped rows stay as they were."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpucloud.catalog import load_catalog
from gpucloud.catalog.refresh import refresh
from tests.support.fake_prices import FakeAzure, azure_item

T4 = "Standard_NC4as_T4_v3"


@pytest.fixture
def prices(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAzure]:
    fake = FakeAzure(
        items=[
            azure_item(T4, "eastus", 0.526),
            azure_item(T4, "newzealandnorth", 0.752),
            azure_item(T4, "newzealandnorth", 0.0901, spot=True),
            azure_item(T4, "austriaeast", 0.6049),
            azure_item(T4, "chilecentral", 0.9, windows=True),  # a Windows price: not a Linux sale
        ],
    ).start()
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    for key in ("GPUCLOUD_AZURE_ARM_ENDPOINT", "AZURE_SUBSCRIPTION_ID", "IDENTITY_ENDPOINT", "IDENTITY_HEADER"):
        monkeypatch.delenv(key, raising=False)
    yield fake
    fake.stop()


def _rows(region: str) -> list[object]:
    return [o for o in load_catalog().offerings if o.cloud == "azure" and o.region == region]


def test_a_keyless_refresh_adds_every_region_the_prices_name(prices: FakeAzure) -> None:
    assert _rows("newzealandnorth") == [] and _rows("austriaeast") == []  # not shipped
    report = refresh(["azure"])
    assert report.clouds["azure"]["refreshed"]
    (nz,) = [o for o in _rows("newzealandnorth") if o.instance_type == T4]  # type: ignore[attr-defined]
    assert (nz.price_per_hour, nz.spot_price_per_hour, nz.gpu, nz.vcpus) == (0.752, 0.0901, "T4", 4)
    assert "sold in this region by its retail price" in nz.source and nz.price_date
    assert [o.instance_type for o in _rows("austriaeast")] == [T4]  # type: ignore[attr-defined]
    assert _rows("chilecentral") == []
    assert not any("/subscriptions/" in r for r in prices.requests)  # prices only: no ARM call


def test_refresh_of_one_new_region_then_a_plan_there(prices: FakeAzure) -> None:
    from gpucloud.plan.planner import make_plan
    from gpucloud.spec.load import parse_spec

    report = refresh(["azure"], regions=["newzealandnorth"])
    assert report.clouds["azure"]["refreshed"]
    assert _rows("austriaeast") == []  # only the region asked for
    spec = parse_spec(
        "name: t\nresources:\n  cloud: azure\n  regions: [newzealandnorth]\n  gpu: T4:1\nrun: echo\n", "job.yaml"
    )
    plan = make_plan(spec, cloud="azure")
    assert plan.candidates and plan.candidates[0].region == "newzealandnorth"
    assert plan.candidates[0].instance_type == T4
