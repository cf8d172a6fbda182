"""Prices from a price API are checked (docs/SECURITY.md, "Prices"): NaN, infinity, 1e308 and
1e-300 never reach the catalog, the planner never ranks a non-finite price, and `--json` never
prints a bare NaN. Through the real CLI against the fake Retail Prices server and moto + the fake
Price List."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpucloud.catalog import load_catalog, offerings_db
from tests.support.cli import ci_env, cli
from tests.support.fake_prices import FakeAwsPricing, FakeAzure, aws_product, azure_item, azure_sku
from tests.support.moto_server import Moto, moto, moto_server  # noqa: F401
from tests.support.text import flat

REPO = Path(__file__).resolve().parents[2]


def strict_json(text: str) -> object:
    """json.loads that refuses NaN and Infinity (what any other JSON reader does)."""

    def refuse(token: str) -> object:
        raise AssertionError(f"bare {token} in --json output")

    return json.loads(text, parse_constant=refuse)


SIZES = (
    "Standard_NC4as_T4_v3",
    "Standard_NC8as_T4_v3",
    "Standard_NC16as_T4_v3",
    "Standard_NC64as_T4_v3",
    "Standard_NC40ads_H100_v5",
)


@pytest.fixture
def hostile_azure(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAzure]:
    """A Retail Prices API that answers NaN, Infinity, 1e308 and 1e-300 (JSON as Python writes it)."""
    fake = FakeAzure(
        skus=[azure_sku(name, ["eastus"], 4 if "64" in name else 1, 4, 28) for name in SIZES],
        items=[
            azure_item("Standard_NC4as_T4_v3", "eastus", math.nan),
            azure_item("Standard_NC8as_T4_v3", "eastus", 1e-300),
            azure_item("Standard_NC16as_T4_v3", "eastus", 1e308),
            azure_item("Standard_NC64as_T4_v3", "eastus", 4.352),
            azure_item("Standard_NC64as_T4_v3", "eastus", math.nan, spot=True),
            azure_item("Standard_NC40ads_H100_v5", "eastus", 6.98),
            azure_item("Standard_NC40ads_H100_v5", "eastus", 1e-300, spot=True),
        ],
    ).start()
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    yield fake
    fake.stop()


def _job(tmp_path: Path, **resources: object) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "run": "true", "max_duration": "1h", "resources": resources}))
    return path


def test_azure_nan_inf_huge_and_tiny_prices_are_dropped_with_the_source_named(
    hostile_azure: FakeAzure, tmp_path: Path
) -> None:
    out = cli("catalog", "refresh", "--cloud", "azure", "--json", env=ci_env(), cwd=REPO)
    assert out.returncode == 0, out.stderr
    doc = strict_json(out.stdout)
    assert isinstance(doc, dict) and doc["complete"] is False  # dropped rows make the refresh partial
    for size, why in (
        ("Standard_NC4as_T4_v3", "nan is not a finite number"),
        ("Standard_NC8as_T4_v3", "1e-300 is $1e-300 per GPU-hour, outside the sane range"),
        ("Standard_NC16as_T4_v3", "1e+308 is $1e+308 per GPU-hour, outside the sane range"),
    ):
        assert f"azure price API: {size} in eastus: on-demand price {why}" in flat(out.stderr), out.stderr
    assert "Standard_NC64as_T4_v3 in eastus: spot price nan is not a finite number; spot left unknown" in flat(
        out.stderr
    )
    rows = {
        (o.instance_type, o.region): o
        for o in load_catalog().offerings
        if o.cloud == "azure" and o.region == "eastus" and o.instance_type in SIZES
    }
    assert set(rows) == {("Standard_NC64as_T4_v3", "eastus"), ("Standard_NC40ads_H100_v5", "eastus")}
    assert rows[("Standard_NC64as_T4_v3", "eastus")].spot_price_per_hour is None
    assert rows[("Standard_NC40ads_H100_v5", "eastus")].spot_price_per_hour is None  # 1e-300 spot

    # A $0.10 cap: nothing passes (1e-300 would have shown as $0.000/h and passed).
    capped = cli(
        "plan", str(_job(tmp_path, cloud="azure", gpu="T4", max_price_per_hour=0.10)), "--json", env=ci_env(), cwd=REPO
    )
    assert capped.returncode != 0 and "Traceback" not in capped.stderr
    strict_json(capped.stdout)
    plan = cli("plan", str(_job(tmp_path, cloud="azure", gpu="T4")), "--json", env=ci_env(), cwd=REPO)
    assert plan.returncode == 0, plan.stderr
    first = strict_json(plan.stdout)["candidates"][0]  # type: ignore[index]
    assert first["price_per_hour"] > 0.05 and first["instance_type"] != "Standard_NC8as_T4_v3"


def test_aws_nan_and_tiny_prices_from_the_price_list_are_dropped(
    moto: Moto,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    products = [aws_product("g4dn.xlarge", "us-east-1", 0.526), aws_product("g4dn.2xlarge", "us-east-1", 0.752)]
    products[0]["terms"]["OnDemand"]["T1"]["priceDimensions"]["D1"]["pricePerUnit"]["USD"] = "NaN"
    products[1]["terms"]["OnDemand"]["T1"]["priceDimensions"]["D1"]["pricePerUnit"]["USD"] = "1e-300"
    fake = FakeAwsPricing(products=products).start()
    monkeypatch.setenv("GPUCLOUD_AWS_PRICING_URL", fake.url)
    try:
        out = cli("catalog", "refresh", "--cloud", "aws", "--region", "us-east-1", "--json", env=ci_env(), cwd=REPO)
    finally:
        fake.stop()
    assert out.returncode == 0, out.stderr
    strict_json(out.stdout)
    assert "aws price API: g4dn.xlarge in us-east-1: on-demand price nan is not a finite number" in flat(out.stderr)
    assert "aws price API: g4dn.2xlarge in us-east-1: on-demand price 1e-300 is $1e-300 per GPU-hour" in flat(
        out.stderr
    )
    fresh = {
        o.instance_type
        for o in load_catalog().offerings
        if o.cloud == "aws"
        and o.region == "us-east-1"
        and o.status == "active"
        and o.price_date.startswith("20")
        and "[S]" in o.source
        and o.instance_type.startswith("g4dn.")
        and o.price_per_hour in (0.526, 0.752)
    }
    assert not fresh  # neither bad row was stored
    assert all(math.isfinite(o.price_per_hour) for o in load_catalog().offerings)


def test_planner_refuses_a_non_finite_price_already_in_a_cache(tmp_path: Path) -> None:
    """A cache written before prices were checked (or edited by hand) still cannot rank NaN first."""
    shipped = load_catalog().offerings
    t4 = next(o for o in shipped if o.cloud == "azure" and o.instance_type == "Standard_NC4as_T4_v3")
    rows = [
        *shipped,
        t4._replace(region="nanland", price_per_hour=math.nan),
        t4._replace(region="infland", price_per_hour=math.inf, spot_price_per_hour=math.nan),
    ]
    offerings_db.write(offerings_db.cache_file(), rows, created_at="2026-12-04T00:00:00Z", clouds={})
    plan = cli("plan", str(_job(tmp_path, gpu="T4", max_price_per_hour=10)), "--json", env=ci_env(), cwd=REPO)
    assert plan.returncode == 0, plan.stderr
    doc = strict_json(plan.stdout)
    assert isinstance(doc, dict)
    assert not any(c["region"] in ("nanland", "infland") for c in doc["candidates"])
    assert all(c["price_per_hour"] > 0 for c in doc["candidates"])
    listing = cli("catalog", "--gpu", "T4", "--json", env=ci_env(), cwd=REPO)
    assert listing.returncode == 0, listing.stderr
    bad = [r for r in strict_json(listing.stdout) if r["region"] in ("nanland", "infland")]  # type: ignore[union-attr]
    assert bad and all(r["price_per_hour"] is None for r in bad)  # null, never a bare NaN
