"""The shipped catalog: completeness against docs/CATALOG.md (FACTS s1-2), provenance, statuses, lookups."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

import gpucloud.catalog as catalog_mod
from gpucloud.catalog import CatalogError, gpu_names, load_catalog, resolve_gpu_name

FACTS_GPUS = [
    "K40",
    "K80",
    "M60",
    "P100",
    "P40",
    "V100",
    "V100-32GB",
    "T4",
    "T4G",
    "A10G",
    "A10",
    "L4",
    "L40S",
    "A100-40GB",
    "A100-80GB",
    "H100",
    "H100-NVL",
    "H200",
    "B200",
    "GB200",
]

# (cloud, instance type) -> (GPU, count, vCPUs, memory GiB, us-east-1/eastus $/h, status), docs/CATALOG.md (FACTS s1-2).
FACTS_TYPES = {
    ("aws", "p2.xlarge"): ("K80", 1, 4, 61, 0.90, "retired"),
    ("aws", "p2.8xlarge"): ("K80", 8, 32, 488, 7.20, "retired"),
    ("aws", "p2.16xlarge"): ("K80", 16, 64, 732, 14.40, "retired"),
    ("aws", "p6-b200.48xlarge"): ("B200", 8, 192, 2048, 113.9328, "active"),
    ("azure", "Standard_NC40ads_H100_v5"): ("H100-NVL", 1, 40, 320, 6.98, "active"),
    ("azure", "Standard_NC80adis_H100_v5"): ("H100-NVL", 2, 80, 640, 13.96, "active"),
    ("azure", "Standard_NC48ads_A100_v4"): ("A100-80GB", 2, 48, 440, 7.346, "active"),
    ("aws", "g4dn.xlarge"): ("T4", 1, 4, 16, 0.526, "active"),
    ("aws", "g4dn.12xlarge"): ("T4", 4, 48, 192, 3.912, "active"),
    ("aws", "g5.xlarge"): ("A10G", 1, 4, 16, 1.006, "active"),
    ("aws", "g5.12xlarge"): ("A10G", 4, 48, 192, 5.672, "active"),
    ("aws", "g6.xlarge"): ("L4", 1, 4, 16, 0.8048, "active"),
    ("aws", "g6.2xlarge"): ("L4", 1, 8, 32, 0.9776, "active"),
    ("aws", "g6.24xlarge"): ("L4", 4, 96, 384, 6.6752, "active"),
    ("aws", "g6e.xlarge"): ("L40S", 1, 4, 32, 1.861, "active"),
    ("aws", "g6e.48xlarge"): ("L40S", 8, 192, 1536, 30.13118, "active"),
    ("aws", "p4d.24xlarge"): ("A100-40GB", 8, 96, 1152, 21.957642, "active"),
    ("aws", "p4de.24xlarge"): ("A100-80GB", 8, 96, 1152, 27.44705, "active"),
    ("aws", "p5.4xlarge"): ("H100", 1, 16, 256, 6.88, "active"),
    ("aws", "p5.48xlarge"): ("H100", 8, 192, 2048, 55.04, "active"),
    ("aws", "p5en.48xlarge"): ("H200", 8, 192, 2048, 63.296, "active"),
    ("aws", "p3.2xlarge"): ("V100", 1, 8, 61, 3.06, "retired"),
    ("aws", "p3.8xlarge"): ("V100", 4, 32, 244, 12.24, "retired"),
    ("aws", "p3.16xlarge"): ("V100", 8, 64, 488, 24.48, "retired"),
    ("azure", "Standard_NC6"): ("K80", 1, 6, 56, 0.90, "retired"),
    ("azure", "Standard_NC12"): ("K80", 2, 12, 112, 1.80, "retired"),
    ("azure", "Standard_NC24"): ("K80", 4, 24, 224, 3.60, "retired"),
    ("azure", "Standard_NC24r"): ("K80", 4, 24, 224, 3.96, "retired"),
    ("azure", "Standard_NC4as_T4_v3"): ("T4", 1, 4, 28, 0.526, "active"),
    ("azure", "Standard_NC64as_T4_v3"): ("T4", 4, 64, 440, 4.352, "active"),
    ("azure", "Standard_NC24ads_A100_v4"): ("A100-80GB", 1, 24, 220, 3.673, "active"),
    ("azure", "Standard_NC96ads_A100_v4"): ("A100-80GB", 4, 96, 880, 14.692, "active"),
    ("azure", "Standard_ND96asr_v4"): ("A100-40GB", 8, 96, 900, 27.197, "active"),
    ("azure", "Standard_ND96amsr_A100_v4"): ("A100-80GB", 8, 96, 1800, 32.77, "active"),
    ("azure", "Standard_ND96isr_H100_v5"): ("H100", 8, 96, 1900, 98.32, "active"),
    ("azure", "Standard_NV36ads_A10_v5"): ("A10", 1, 36, 440, 3.20, "active"),
    ("azure", "Standard_NC6s_v3"): ("V100", 1, 6, 112, 3.06, "retired"),
    ("azure", "Standard_NC24s_v3"): ("V100", 4, 24, 448, 12.24, "retired"),
    # One us-east-1 / eastus row each, skypilot-catalog v8 @00148f2 / v6 @098741e (docs/CATALOG.md).
    ("aws", "g4dn.2xlarge"): ("T4", 1, 8, 32, 0.752, "active"),
    ("aws", "g4dn.4xlarge"): ("T4", 1, 16, 64, 1.204, "active"),
    ("aws", "g4dn.8xlarge"): ("T4", 1, 32, 128, 2.176, "active"),
    ("aws", "g4dn.16xlarge"): ("T4", 1, 64, 256, 4.352, "active"),
    ("aws", "g4dn.metal"): ("T4", 8, 96, 384, 7.824, "active"),
    ("aws", "g5.2xlarge"): ("A10G", 1, 8, 32, 1.212, "active"),
    ("aws", "g5.4xlarge"): ("A10G", 1, 16, 64, 1.624, "active"),
    ("aws", "g5.16xlarge"): ("A10G", 1, 64, 256, 4.096, "active"),
    ("aws", "g5.24xlarge"): ("A10G", 4, 96, 384, 8.144, "active"),
    ("aws", "g5.48xlarge"): ("A10G", 8, 192, 768, 16.288, "active"),
    ("aws", "g5.8xlarge"): ("A10G", 1, 32, 128, 2.448, "active"),
    ("aws", "g5g.xlarge"): ("T4G", 1, 4, 8, 0.42, "active"),
    ("aws", "g5g.2xlarge"): ("T4G", 1, 8, 16, 0.556, "active"),
    ("aws", "g5g.4xlarge"): ("T4G", 1, 16, 32, 0.828, "active"),
    ("aws", "g5g.8xlarge"): ("T4G", 1, 32, 64, 1.372, "active"),
    ("aws", "g5g.16xlarge"): ("T4G", 2, 64, 128, 2.744, "active"),
    ("aws", "g5g.metal"): ("T4G", 2, 64, 128, 2.744, "active"),
    ("aws", "g6.12xlarge"): ("L4", 4, 48, 192, 4.6016, "active"),
    ("aws", "g6.4xlarge"): ("L4", 1, 16, 64, 1.3232, "active"),
    ("aws", "g6.8xlarge"): ("L4", 1, 32, 128, 2.0144, "active"),
    ("aws", "g6.16xlarge"): ("L4", 1, 64, 256, 3.3968, "active"),
    ("aws", "g6.48xlarge"): ("L4", 8, 192, 768, 13.3504, "active"),
    ("aws", "g6e.12xlarge"): ("L40S", 4, 48, 384, 10.49264, "active"),
    ("aws", "g6e.2xlarge"): ("L40S", 1, 8, 64, 2.24208, "active"),
    ("aws", "g6e.4xlarge"): ("L40S", 1, 16, 128, 3.00424, "active"),
    ("aws", "g6e.8xlarge"): ("L40S", 1, 32, 256, 4.52856, "active"),
    ("aws", "g6e.16xlarge"): ("L40S", 1, 64, 512, 7.57719, "active"),
    ("aws", "g6e.24xlarge"): ("L40S", 4, 96, 768, 15.06559, "active"),
    ("aws", "p3dn.24xlarge"): ("V100-32GB", 8, 96, 768, 31.212, "active"),
    # L4 with more memory per vCPU; us-east-1 on-demand from the AWS Price List via tsaol/aws-gpu (2026-08-26).
    ("aws", "gr6.4xlarge"): ("L4", 1, 16, 128, 1.5392, "active"),
    ("aws", "gr6.8xlarge"): ("L4", 1, 32, 256, 2.4464, "active"),
    ("azure", "Standard_NC8as_T4_v3"): ("T4", 1, 8, 56, 0.752, "active"),
    ("azure", "Standard_NC16as_T4_v3"): ("T4", 1, 16, 110, 1.204, "active"),
    ("azure", "Standard_NV36adms_A10_v5"): ("A10", 1, 36, 880, 4.52, "active"),
    ("azure", "Standard_NV72ads_A10_v5"): ("A10", 2, 72, 880, 6.52, "active"),
    ("azure", "Standard_NV12s_v3"): ("M60", 1, 12, 112, 1.14, "active"),
    ("azure", "Standard_NV24s_v3"): ("M60", 2, 24, 224, 2.28, "active"),
    ("azure", "Standard_NV48s_v3"): ("M60", 4, 48, 448, 4.56, "active"),
    # Azure's retail prices via Azure/karpenter-provider-azure @2b431da (2026-06-18): no eastus price,
    # eastus2 is its home row (HOMES); size from azure-compute-docs nd-h200-v5-series.md.
    ("azure", "Standard_ND96isr_H200_v5"): ("H200", 8, 96, 1850, 84.8, "active"),
}
HOMES = {"aws": "us-east-1", "azure": "eastus", "Standard_ND96isr_H200_v5": "eastus2"}
STATUS_DATES = {
    "p2": "2026-12-03",
    "p3": "2025-12-20",
    "Standard_NC6s_v3": "2025-09-30",
    "Standard_NC24s_v3": "2025-09-30",
    "Standard_NC6": "2023-09-06",
    "Standard_NC12": "2023-09-06",
    "Standard_NC24": "2023-09-06",
    "Standard_NC24r": "2023-09-06",
}
REGIONS = {
    "aws": {"us-east-1", "us-west-2", "eu-west-1", "ap-northeast-1"},
    "azure": {"eastus", "westus2", "westeurope", "southeastasia"},
}


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


def test_every_facts_gpu_is_present_in_order(cat):
    assert gpu_names() == FACTS_GPUS
    assert list(cat.gpus) == FACTS_GPUS


def test_k80_row_uses_the_board_seed_figures(cat):
    k80 = cat.gpu("K80")
    assert (k80.architecture, k80.compute_capability, k80.memory_gib) == ("Kepler", "3.7", 12)
    assert (k80.fp32_tflops, k80.fp64_tflops, k80.bandwidth_gbs) == (8.74, 2.91, 480)
    assert "GK210" in k80.source and "one GPU" in k80.source
    assert cat.gpu("K40").compute_capability == "3.5"


def test_architectures_and_compute_capabilities(cat):
    expected = {
        "K40": "Kepler",
        "K80": "Kepler",
        "M60": "Maxwell",
        "P100": "Pascal",
        "P40": "Pascal",
        "V100": "Volta",
        "T4": "Turing",
        "A10G": "Ampere",
        "A10": "Ampere",
        "L4": "Ada",
        "L40S": "Ada",
        "A100-40GB": "Ampere",
        "A100-80GB": "Ampere",
        "H100": "Hopper",
        "H200": "Hopper",
        "V100-32GB": "Volta",
        "T4G": "Turing",
        "H100-NVL": "Hopper",
        "B200": "Blackwell",
        "GB200": "Blackwell",
    }
    assert {g.name: g.architecture for g in cat.gpus.values()} == expected
    for g in cat.gpus.values():
        assert g.source, g.name
        assert re.fullmatch(r"\d{1,2}\.\d", g.compute_capability)


def test_every_facts_instance_type_is_present_with_its_facts(cat):
    by_type = defaultdict(list)
    for o in cat.offerings:
        by_type[(o.cloud, o.instance_type)].append(o)
    assert set(by_type) == set(FACTS_TYPES)
    for key, (gpu, count, vcpus, mem, price, status) in FACTS_TYPES.items():
        rows = by_type[key]
        for o in rows:
            assert (o.gpu, o.gpu_count, o.vcpus, o.memory_gib, o.status) == (gpu, count, vcpus, mem, status), key
        home = HOMES.get(key[1], HOMES[key[0]])
        homes = [o for o in rows if o.region == home]
        assert homes and homes[0].price_per_hour == pytest.approx(price), key


@pytest.mark.parametrize("cloud", ["aws", "azure"])
def test_at_least_four_regions_per_cloud_and_per_common_type(cat, cloud):
    assert REGIONS[cloud] <= set(cat.regions(cloud))
    # The widely deployed types are in all four standard regions; the rest in at least two.
    for (c, t), _facts in FACTS_TYPES.items():
        if c != cloud:
            continue
        regions = {o.region for o in cat.offerings if o.cloud == c and o.instance_type == t}
        assert len(regions) >= (1 if t in NEW_TYPES else 2), t
        if t not in NEW_TYPES and t.startswith(
            (
                "g4dn",
                "g5.",
                "g6",
                "p3.",
                "p2.",
                "Standard_NC4as",
                "Standard_NC64as",
                "Standard_NC24ads",
                "Standard_NV36",
            )
        ):
            missing = {r for r in REGIONS[cloud] - regions if (t, r) not in SIX_NOT_OFFERED}
            assert not missing, t


def test_every_row_has_provenance_and_estimates_are_marked(cat):
    for o in cat.offerings:
        assert o.source and o.price_date, o
        sourced = "[S" in o.source
        assert sourced or "[estimate:" in o.source, o
        assert o.price_per_hour > 0
        if o.spot_price_per_hour is not None:
            assert 0 < o.spot_price_per_hour <= o.price_per_hour, o


NEW_TYPES = {"p6-b200.48xlarge", "Standard_NC40ads_H100_v5", "Standard_NC80adis_H100_v5", "Standard_NC48ads_A100_v4"}
# One home-region row each (us-east-1 / eastus).
ISSUE12_TYPES = {
    "g4dn.2xlarge",
    "g4dn.4xlarge",
    "g4dn.8xlarge",
    "g4dn.16xlarge",
    "g4dn.metal",
    "g5.2xlarge",
    "g5.4xlarge",
    "g5.16xlarge",
    "g5.24xlarge",
    "g5.48xlarge",
    "g5.8xlarge",
    "g5g.xlarge",
    "g5g.2xlarge",
    "g5g.4xlarge",
    "g5g.8xlarge",
    "g5g.16xlarge",
    "g5g.metal",
    "g6.12xlarge",
    "g6.4xlarge",
    "g6.8xlarge",
    "g6.16xlarge",
    "g6.48xlarge",
    "g6e.12xlarge",
    "g6e.2xlarge",
    "g6e.4xlarge",
    "g6e.8xlarge",
    "g6e.16xlarge",
    "g6e.24xlarge",
    "p3dn.24xlarge",
    "Standard_NC8as_T4_v3",
    "Standard_NC16as_T4_v3",
    "Standard_NV36adms_A10_v5",
    "Standard_NV72ads_A10_v5",
    "Standard_NV12s_v3",
    "Standard_NV24s_v3",
    "Standard_NV48s_v3",
}
NEW_TYPES |= ISSUE12_TYPES
SIX_NOT_OFFERED = {
    ("g6.xlarge", "eu-west-1"),
    ("g6.2xlarge", "eu-west-1"),
    ("g6.24xlarge", "eu-west-1"),
    ("g6e.xlarge", "eu-west-1"),
    ("g6e.48xlarge", "eu-west-1"),
    ("p5.48xlarge", "eu-west-1"),
}


def test_not_offered_rows_are_gone_and_no_flat_spot_estimate(cat):
    keys = {(o.instance_type, o.region) for o in cat.offerings if o.cloud == "aws"}
    assert not keys & SIX_NOT_OFFERED
    for o in cat.offerings:
        assert "spot = 0.45" not in o.source, o
        if o.cloud == "aws" and o.spot_price_per_hour is not None:
            assert "observed" in o.source or "lowest" in o.source, o
    p5 = next(o for o in cat.offerings if o.instance_type == "p5.48xlarge" and o.region == "us-east-1")
    assert p5.spot_price_per_hour == 14.25
    assert {o.instance_type for o in cat.offerings if o.arch != "x86_64"} == {
        "g5g.xlarge",
        "g5g.2xlarge",
        "g5g.4xlarge",
        "g5g.8xlarge",
        "g5g.16xlarge",
        "g5g.metal",
    }
    assert {o.arch for o in cat.offerings if o.instance_type.startswith("g5g.")} == {"arm64"}


def test_families_match_every_memory_variant(cat):
    assert cat.members(cat.resolve("a100")) == ("A100-40GB", "A100-80GB")
    assert cat.members(cat.resolve("V100")) == ("V100", "V100-32GB")
    assert cat.members(cat.resolve("A100-40GB")) == ("A100-40GB",)
    assert {o.gpu for o in cat.query(gpu="A100")} == {"A100-40GB", "A100-80GB"}
    assert {o.gpu for o in cat.query(gpu="A100-80GB")} == {"A100-80GB"}
    assert cat.gpu("A100").architecture == "Ampere"
    assert cat.variant_for("A100", 40.0) == "A100-40GB" and cat.variant_for("V100", 32.0) == "V100-32GB"


def test_statuses_and_dates(cat):
    for o in cat.offerings:
        expected = FACTS_TYPES[(o.cloud, o.instance_type)][5]
        assert o.status == expected
        key = o.instance_type.split(".")[0] if o.cloud == "aws" else o.instance_type
        if key in STATUS_DATES:
            assert o.status_date == STATUS_DATES[key], o
    assert cat.query(gpu="K80", cloud="aws") == []
    p2 = cat.query(gpu="K80", cloud="aws", include_retired=True)[0]
    assert p2.status == "retired" and "not offered by the current AWS API" in p2.source and "moto" in p2.source


def test_query_filters_and_retired_rows(cat):
    k80_aws = cat.query(gpu="k80", cloud="AWS", include_retired=True)
    assert k80_aws and all(o.instance_type.startswith("p2.") for o in k80_aws)
    assert cat.query(gpu="K80", cloud="azure") == []  # NC v1 is retired
    retired = cat.query(gpu="K80", cloud="azure", include_retired=True)
    assert {o.instance_type for o in retired} == {"Standard_NC6", "Standard_NC12", "Standard_NC24", "Standard_NC24r"}
    # p3/NCv3 are retired; only p3dn.24xlarge (V100-32GB, still priced in skypilot-catalog v8) stays active.
    assert {o.instance_type for o in cat.query(gpu="V100")} == {"p3dn.24xlarge"}
    assert len(cat.query(gpu="V100", include_retired=True)) > 0
    east = cat.query(cloud="aws", region="us-east-1")
    assert east and all(o.region == "us-east-1" for o in east)
    prices = [o.price_per_hour for o in cat.query(gpu="T4")]
    assert prices == sorted(prices)
    assert cat.query(region="nowhere-1") == []
    with pytest.raises(KeyError):
        cat.query(gpu="GTX1080")


def test_k40_has_no_offering(cat):
    assert cat.query(gpu="K40", include_retired=True) == []


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("k80", "K80"),
        ("Tesla-K80", "K80"),
        ("tesla k40", "K40"),
        ("a100-40", "A100-40GB"),
        ("t4g", "T4G"),
        ("a100-40g", "A100-40GB"),
        ("A100-80G", "A100-80GB"),
        ("a100 80gb", "A100-80GB"),
        ("H100-80GB", "H100"),
        ("nvidia h100", "H100"),
        ("l40s", "L40S"),
        ("A10G", "A10G"),
        ("a10", "A10"),
        ("NVIDIA T4", "T4"),
        ("v100", "V100"),
    ],
)
def test_aliases_resolve(cat, alias, canonical):
    assert resolve_gpu_name(alias) == canonical
    assert cat.gpu(alias).name == canonical


def test_unknown_names(cat):
    assert resolve_gpu_name("GTX1080") is None
    assert resolve_gpu_name("") is None
    with pytest.raises(KeyError, match="known: K40"):
        cat.gpu("B300")


def test_load_is_cached(cat):
    assert load_catalog() is load_catalog()


def test_a_rewritten_catalog_file_is_read_again_and_the_shipped_csvs_are_not(gpucloud_home):
    """After a refresh rewrote the catalog file, the next plan reads the new rows; the shipped CSVs,
    which cannot change in a running process, are not parsed again (~30 ms each time)."""
    from gpucloud.catalog import forget_refreshed, offerings_db, shipped_catalog
    from gpucloud.catalog.rows import RowFilter

    shipped = shipped_catalog().offerings
    assert load_catalog().meta.origin == "shipped"
    new = [shipped[0]._replace(region="newregion-1")]
    offerings_db.write(offerings_db.cache_file(), new, created_at="2026-12-07T00:00:00Z", clouds={})
    forget_refreshed()
    assert [off for _, off in load_catalog().rows.select(RowFilter(regions=frozenset({"newregion-1"})))] == new
    assert shipped_catalog().offerings is shipped


def test_bad_row_names_file_and_line(monkeypatch):
    """A malformed data file fails loudly with file and line, not with a bare ValueError."""
    real = catalog_mod._read

    def corrupt(name, expected):
        rows = real(name, expected)
        if name == "offerings.csv":
            line, row = rows[2]
            rows[2] = (line, {**row, "price_per_hour": "cheap"})
        return rows

    monkeypatch.setattr(catalog_mod, "_read", corrupt)
    load_catalog.cache_clear()
    try:
        with pytest.raises(CatalogError, match=r"offerings\.csv line 4: price_per_hour: 'cheap' is not a number"):
            load_catalog()
    finally:
        monkeypatch.undo()
        load_catalog.cache_clear()


def test_unknown_gpu_in_offerings_is_rejected(monkeypatch):
    real = catalog_mod._read

    def corrupt(name, expected):
        rows = real(name, expected)
        if name == "offerings.csv":
            line, row = rows[0]
            rows[0] = (line, {**row, "gpu": "A100"})  # an alias, not a canonical name
        return rows

    monkeypatch.setattr(catalog_mod, "_read", corrupt)
    load_catalog.cache_clear()
    try:
        with pytest.raises(CatalogError, match=r"offerings\.csv line 2: gpu: 'A100' is not a canonical name"):
            load_catalog()
    finally:
        monkeypatch.undo()
        load_catalog.cache_clear()
