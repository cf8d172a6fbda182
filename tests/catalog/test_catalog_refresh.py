"""`gpucloud catalog refresh` against moto (server mode) and local servers playing the price APIs:
exactly the offerings the API lists, the prices the price API pages give, and a valid cache plus a
clear message whenever a source fails. The planner's brute-force check runs on the refreshed data."""

from __future__ import annotations

import gzip
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucloud.catalog import load_catalog, offerings_db
from gpucloud.catalog.refresh import RefreshFailed, refresh
from gpucloud.errors import UserError
from gpucloud.plan.planner import make_plan
from tests.support.cli import cli
from tests.support.fake_prices import FakeAwsPricing, FakeAzure, aws_product, azure_item, azure_sku
from tests.support.moto_server import Moto, moto, moto_server  # noqa: F401
from tests.support.planner_oracle import brute_force_cheapest, job

REPO = Path(__file__).resolve().parents[2]
REGIONS = ["us-east-1", "eu-west-1"]
AZURE_ENV = (
    "GPUCLOUD_AZURE_ARM_ENDPOINT",
    "AZURE_SUBSCRIPTION_ID",
    "IDENTITY_ENDPOINT",
    "IDENTITY_HEADER",
    "GPUCLOUD_AZURE_PRICES_URL",
)


def moto_gpu_offerings() -> dict[str, set[str]]:
    """What moto's bundled (real) AWS data says: region -> whole-GPU NVIDIA types with a model the
    catalog knows, read from the package files, independently of the product code."""
    import moto as moto_pkg

    base = Path(moto_pkg.__file__).parent / "ec2" / "resources"
    types = json.loads(gzip.open(base / "instance_types.json.gz").read())
    names = set(load_catalog().gpus) | set(load_catalog().families)
    gpu_types = set()
    for name, it in types.items():
        gpus = (it.get("GpuInfo") or {}).get("Gpus") or []
        if (
            gpus
            and gpus[0]["Manufacturer"] == "NVIDIA"
            and gpus[0]["Count"]
            and gpus[0]["Name"].replace(" ", "-").upper() in names
        ):
            gpu_types.add(name)
    out = {}
    for region in REGIONS:
        rows = json.loads(
            gzip.open(base / "instance_type_offerings" / "availability-zone" / f"{region}.json.gz").read()
        )
        out[region] = {r["InstanceType"] for r in rows} & gpu_types
    return out


def price_for(instance_type: str, region: str) -> float:
    """A distinct, deterministic price per (type, region) for the fake Price List."""
    return round(1 + sum(map(ord, instance_type)) / 100 + (0.5 if region == "eu-west-1" else 0), 4)


@pytest.fixture(scope="module")
def expected() -> dict[str, set[str]]:
    return moto_gpu_offerings()


@pytest.fixture
def pricing(expected: dict[str, set[str]], monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAwsPricing]:
    products = [aws_product(t, r, price_for(t, r)) for r, ts in expected.items() for t in sorted(ts)]
    products.append(aws_product("g4dn.xlarge", "us-east-1", 9.99, operatingSystem="Windows"))  # must be ignored
    # One type the family query misses (another instanceFamily value): found by the by-name query.
    for p in products:
        if p["product"]["attributes"]["instanceType"] == "p5.4xlarge":
            p["product"]["attributes"]["instanceFamily"] = "Accelerated Computing"
    fake = FakeAwsPricing(products=products).start()
    monkeypatch.setenv("GPUCLOUD_AWS_PRICING_URL", fake.url)
    yield fake
    fake.stop()


@pytest.fixture
def no_azure(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in AZURE_ENV:
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
def azure(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAzure]:
    fake = FakeAzure(
        skus=[
            azure_sku(
                "Standard_NC4as_T4_v3",
                ["eastus", "westeurope", "chilecentral"],
                1,
                4,
                28,
                restricted=["chilecentral"],
            ),
            azure_sku("Standard_NC40ads_H100_v5", ["eastus"], 1, 40, 320),
            azure_sku("Standard_D4s_v5", ["eastus"], 0, 4, 16),  # no GPU: ignored
            azure_sku("Standard_ND96isr_MI300X_v5", ["eastus"], 8, 96, 1850),
        ],  # not in the table: reported
        items=[
            azure_item("Standard_NC4as_T4_v3", "eastus", 0.526),
            azure_item("Standard_NC4as_T4_v3", "eastus", 0.0627, spot=True),
            azure_item("Standard_NC4as_T4_v3", "eastus", 0.9, windows=True),
            azure_item("Standard_NC4as_T4_v3", "westeurope", 0.61),
            azure_item("Standard_NC4as_T4_v3", "chilecentral", 0.7),
            azure_item("Standard_NC40ads_H100_v5", "eastus", 6.98),
        ],
    ).start()
    for key, value in fake.env().items():
        monkeypatch.setenv(key, value)
    yield fake
    fake.stop()


def aws_rows(regions: list[str] = REGIONS) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {r: set() for r in regions}
    for o in load_catalog().offerings:
        if o.cloud == "aws" and o.region in out and o.status != "retired":
            out[o.region].add(o.instance_type)
    return out


def test_refresh_yields_exactly_motos_gpu_offerings(
    moto: Moto, pricing: FakeAwsPricing, no_azure: None, expected: dict[str, set[str]]
) -> None:
    report = refresh(regions=REGIONS)  # every cloud: Azure has no credentials here
    assert report.clouds["aws"]["refreshed"] and report.path == offerings_db.cache_file() and report.path.is_file()
    assert aws_rows() == expected
    assert not any(t.startswith("g6") for t in aws_rows()["eu-west-1"])
    assert "p6-b200.48xlarge" in aws_rows()["us-east-1"]
    cat = load_catalog()
    assert cat.meta.origin == "refreshed"
    by_key = {(o.instance_type, o.region): o for o in cat.offerings if o.cloud == "aws"}
    b200 = by_key[("p6-b200.48xlarge", "us-east-1")]
    assert (b200.gpu, b200.gpu_count, b200.vcpus, b200.arch) == ("B200", 8, 192, "x86_64")
    assert cat.gpus[b200.gpu].architecture == "Blackwell"
    g5g = by_key[("g5g.xlarge", "us-east-1")]
    assert (g5g.gpu, g5g.arch) == ("T4G", "arm64")
    assert by_key[("p4d.24xlarge", "us-east-1")].gpu == "A100-40GB"
    assert by_key[("p4de.24xlarge", "us-east-1")].gpu == "A100-80GB"
    assert by_key[("p3dn.24xlarge", "us-east-1")].gpu == "V100-32GB"
    for (name, region), o in by_key.items():
        if o.status == "retired" or region not in REGIONS:
            continue
        assert o.price_per_hour == pytest.approx(price_for(name, region)), name
        assert o.spot_price_per_hour is None  # moto's spot history says $0.00001: below the sane range
        assert "[S]" in o.source and o.price_date.startswith(report.clouds["aws"]["fetched_at"][:10])
    # Regions not asked for keep their shipped rows; retired rows the API no longer lists stay.
    assert any(o.region == "ap-northeast-1" and o.cloud == "aws" for o in cat.offerings)
    assert any(o.instance_type.startswith("p2.") and o.region == "us-east-1" for o in cat.offerings)
    # Azure had no credentials: kept, and said so.
    assert not report.clouds["azure"]["refreshed"]
    assert "no credentials" in report.clouds["azure"]["problems"][0]
    assert any(o.cloud == "azure" for o in cat.offerings)


def test_pricing_down_refreshes_offerings_and_keeps_old_prices_marked_old(
    moto: Moto, pricing: FakeAwsPricing, no_azure: None, expected: dict[str, set[str]]
) -> None:
    """What is offered is still read from EC2; each type keeps its previous price, marked old
    (price_source "old", its old price date), and the report says the Price List was down."""
    from gpucloud.catalog.prices import price_source

    first = refresh(clouds=["aws"], regions=REGIONS)
    load_catalog.cache_clear()
    prices = {(o.instance_type, o.region): (o.price_per_hour, o.price_date) for o in load_catalog().offerings}
    pricing.down = True
    report = refresh(clouds=["aws"], regions=REGIONS)
    problems = " ".join(report.clouds["aws"]["problems"])  # type: ignore[arg-type]
    assert "Price List" in problems and pricing.url in problems and "marked old" in problems
    load_catalog.cache_clear()
    assert aws_rows() == expected
    fresh = [o for o in load_catalog().offerings if o.cloud == "aws" and o.region in REGIONS and o.status == "active"]
    assert fresh
    for o in fresh:
        source = price_source(o)
        assert source.kind == "old" and "Price List not readable" in source.rule, o.source
        assert (o.price_per_hour, o.price_date) == prices[(o.instance_type, o.region)]
        assert o.price_date == first.clouds["aws"]["fetched_at"]


def test_azure_skus_and_paged_retail_prices(azure: FakeAzure, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    report = refresh(clouds=["azure"])
    rows = {
        (o.instance_type, o.region): o
        for o in load_catalog().offerings
        if o.cloud == "azure"
        and o.status != "retired"
        and o.region in {"eastus", "westeurope", "chilecentral"}
        and o.price_date == report.clouds["azure"]["fetched_at"]
    }
    assert set(rows) == {
        ("Standard_NC4as_T4_v3", "eastus"),
        ("Standard_NC4as_T4_v3", "westeurope"),
        ("Standard_NC40ads_H100_v5", "eastus"),
    }  # chilecentral is restricted for this subscription
    t4 = rows[("Standard_NC4as_T4_v3", "eastus")]
    assert (t4.gpu, t4.price_per_hour, t4.spot_price_per_hour) == ("T4", 0.526, 0.0627)  # Windows row ignored
    assert rows[("Standard_NC4as_T4_v3", "westeurope")].spot_price_per_hour is None  # unknown, not guessed
    assert rows[("Standard_NC40ads_H100_v5", "eastus")].gpu == "H100-NVL"
    assert sum("/api/retail/prices" in r for r in azure.requests) >= 2  # followed NextPageLink
    assert any("MI300X" in p for p in report.clouds["azure"]["problems"])


def test_arm_down_is_a_clear_message_and_keeps_data(
    azure: FakeAzure, moto: Moto, pricing: FakeAwsPricing, expected: dict[str, set[str]]
) -> None:
    azure.down = True
    report = refresh(regions=REGIONS)
    assert report.clouds["aws"]["refreshed"] and not report.clouds["azure"]["refreshed"]
    assert (
        "Resource SKUs" in report.clouds["azure"]["problems"][0] and azure.url in report.clouds["azure"]["problems"][0]
    )
    assert not report.complete
    cat = load_catalog()
    assert {o.instance_type for o in cat.offerings if o.cloud == "azure"} >= {
        "Standard_NC4as_T4_v3",
        "Standard_ND96asr_v4",
    }
    assert aws_rows() == expected


def test_retail_prices_down_is_a_clear_message(azure: FakeAzure, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.moto_server import free_port

    dead = f"http://127.0.0.1:{free_port()}/api/retail/prices"
    monkeypatch.setenv("GPUCLOUD_AZURE_PRICES_URL", dead)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with pytest.raises(RefreshFailed) as info:
        refresh(clouds=["azure"])
    assert "Retail Prices API at " + dead in info.value.render()
    assert not offerings_db.cache_file().exists()  # nothing half-written
    assert load_catalog().meta.origin == "shipped"


def test_unknown_cloud_is_a_user_error() -> None:
    with pytest.raises(UserError):
        refresh(clouds=["nimbus"])


def test_cli_refresh_json_and_catalog_json_carry_source_and_date(
    moto: Moto, pricing: FakeAwsPricing, no_azure: None
) -> None:
    env = {**os.environ, "CI": "true"}
    out = cli("catalog", "refresh", "--cloud", "aws", "--region", "eu-west-1", "--json", env=env, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["clouds"]["aws"]["refreshed"] and doc["complete"] is False  # azure: no credentials
    assert "[aws] eu-west-1" in out.stderr  # progress
    rows = json.loads(cli("catalog", "--region", "eu-west-1", "--json", env=env, cwd=REPO, timeout=60).stdout)
    assert rows and all(r["source"] and r["price_date"] for r in rows)
    assert {"arch", "source", "price_date"} <= set(rows[0])


def test_planner_matches_brute_force_on_refreshed_catalog(
    moto: Moto, pricing: FakeAwsPricing, azure: FakeAzure
) -> None:
    refresh(regions=REGIONS + ["eastus", "westeurope"])
    cat = load_catalog()
    assert cat.meta.origin == "refreshed"
    rng = random.Random(12)
    gpus = sorted({o.gpu for o in cat.offerings if o.status != "retired"}) + sorted(cat.families)
    for _ in range(150):
        policy = rng.choice([False, True, "auto"])
        spec = job(
            gpu=f"{rng.choice(gpus)}:{rng.choice([1, 1, 2, 4, 8])}",
            cloud=rng.choice([["aws"], ["azure"], ["aws", "azure"]]),
            spot=policy,
            max_price_per_hour=rng.choice([None, rng.uniform(0.1, 60)]),
            min_vcpus=rng.choice([None, 4, 8, 48]),
            regions=rng.choice([None, ["us-east-1"], ["eu-west-1", "westeurope"]]),
        )
        best = brute_force_cheapest(spec, policy)
        if best is None:
            with pytest.raises(UserError):
                make_plan(spec)
            continue
        assert make_plan(spec).candidates[0].price_per_hour == pytest.approx(best)


def test_regen_script_rebuilds_the_shipped_csv_with_the_refresh_code(
    moto: Moto, pricing: FakeAwsPricing, no_azure: None, tmp_path: Path, expected: dict[str, set[str]]
) -> None:
    import importlib.util

    from gpucloud.catalog import validate_offerings_text

    spec = importlib.util.spec_from_file_location("regen_catalog", REPO / "tools" / "regen_catalog.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    out = tmp_path / "offerings.csv"
    home = os.environ["GPUCLOUD_HOME"]
    try:
        assert module.main(["--cloud", "aws", "--region", "eu-west-1", "--out", str(out)]) == 0
    finally:
        os.environ["GPUCLOUD_HOME"] = home
        load_catalog.cache_clear()
    rows = validate_offerings_text(out.read_text())
    fresh = {o.instance_type for o in rows if o.cloud == "aws" and o.status != "retired"}
    assert fresh == expected["eu-west-1"]
    assert {o.region for o in rows} == {"eu-west-1"}
    assert not offerings_db.cache_file().exists()  # the user's own cache was not touched


def test_azure_prices_refresh_without_credentials_for_known_sizes(
    azure: FakeAzure, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`catalog refresh --cloud azure` with no Azure credentials: the public Retail Prices API
    prices the sizes the catalog already has (sizes, regions, restrictions kept; other regions the
    prices name are added); a size without a
    retail price keeps its price, marked old. A refresh that does not name Azure leaves it alone."""
    from gpucloud.catalog.prices import price_source

    for key in AZURE_ENV:
        if key != "GPUCLOUD_AZURE_PRICES_URL":
            monkeypatch.delenv(key, raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    before = {(o.instance_type, o.region): o for o in load_catalog().offerings if o.cloud == "azure"}
    report = refresh(clouds=["azure"])
    info = report.clouds["azure"]
    assert info["refreshed"] and "no credentials found" in info["problems"][0]  # type: ignore[index]
    assert not any("/subscriptions/" in r for r in azure.requests)  # no ARM call
    after = {(o.instance_type, o.region): o for o in load_catalog().offerings if o.cloud == "azure"}
    # Sizes as they were, in their regions and every other region the prices name (without credentials
    # the subscription's restrictions are unknown: the row says it is sold there by its price).
    assert set(after) - set(before) == {("Standard_NC4as_T4_v3", "chilecentral")} and set(before) <= set(after)
    assert "sold in this region by its retail price" in after[("Standard_NC4as_T4_v3", "chilecentral")].source
    t4 = after[("Standard_NC4as_T4_v3", "eastus")]
    assert (t4.price_per_hour, t4.spot_price_per_hour) == (0.526, 0.0627)
    assert price_source(t4).kind == "live" and t4.price_date == info["fetched_at"]
    unpriced = after[("Standard_NC6s_v3", "eastus")] if ("Standard_NC6s_v3", "eastus") in after else None
    if unpriced is not None and unpriced.status != "retired":
        assert price_source(unpriced).kind == "old"
        assert unpriced.price_per_hour == before[("Standard_NC6s_v3", "eastus")].price_per_hour
    olds = [o for o in after.values() if o.status != "retired" and price_source(o).kind == "old"]
    assert olds and all(o.price_date == before[(o.instance_type, o.region)].price_date for o in olds)
