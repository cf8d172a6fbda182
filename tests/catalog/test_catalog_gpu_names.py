"""Catalog refresh reads each AWS GPU type as what it is: DescribeInstanceTypes answers with the
quirks AWS has shown (p5en's GPU named "NVIDIA", p4de with 40 GB A100s, p5.4xlarge with 8 GPUs)
still give the type's real GPU and count. Ground truth: moto's bundled copy of AWS's instance-type
data, which has these three right."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpucloud.catalog import load_catalog
from gpucloud.catalog.refresh import FetchContext
from gpucloud.providers.aws.catalog import _gpu_types


def _ctx() -> FetchContext:
    """A real fetch context (paging bounds included) over the shipped catalog."""
    return FetchContext(
        regions=None, catalog=load_catalog(), fetched_at="2026-12-04T00:00:00Z", progress=lambda _m: None
    )


def moto_types() -> dict[str, dict[str, Any]]:
    import moto

    path = Path(moto.__file__).parent / "ec2" / "resources" / "instance_types.json.gz"
    return json.loads(gzip.open(path).read())  # type: ignore[no-any-return]


class _Ec2:
    """DescribeInstanceTypes' paginator over a fixed list (the answer AWS gave)."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def get_paginator(self, name: str) -> Any:
        assert name == "describe_instance_types"
        return SimpleNamespace(
            paginate=lambda: [{"InstanceTypes": self.items[i : i + 100]} for i in range(0, len(self.items), 100)]
        )


def truth(it: dict[str, Any]) -> tuple[str | None, int]:
    g = it["GpuInfo"]["Gpus"][0]
    return load_catalog().variant_for(g["Name"].replace(" ", "-"), g["MemoryInfo"]["SizeInMiB"] / 1024), g["Count"]


def quirky(types: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """moto's data with the answers AWS's API has been seen to give for three types."""
    items = [dict(v, InstanceType=k) for k, v in copy.deepcopy(types).items()]
    by_name = {it["InstanceType"]: it for it in items}
    by_name["p5en.48xlarge"]["GpuInfo"]["Gpus"][0]["Name"] = "NVIDIA"
    by_name["p4de.24xlarge"]["GpuInfo"]["Gpus"][0]["MemoryInfo"]["SizeInMiB"] = 40960
    by_name["p5.4xlarge"]["GpuInfo"]["Gpus"][0]["Count"] = 8
    return items


@pytest.mark.parametrize(
    ("itype", "gpu", "count"),
    [("p5en.48xlarge", "H200", 8), ("p4de.24xlarge", "A100-80GB", 8), ("p5.4xlarge", "H100", 1)],
)
def test_the_quirky_answers_are_read_as_the_real_gpu(itype: str, gpu: str, count: int) -> None:
    types = moto_types()
    assert truth(types[itype]) == (gpu, count)  # moto's data agrees with the override
    parsed, _ = _gpu_types(_Ec2(quirky(types)), _ctx())
    assert (parsed[itype].gpu, parsed[itype].gpu_count) == (gpu, count)


def test_every_nvidia_type_moto_knows_is_read_as_moto_has_it() -> None:
    types = moto_types()
    parsed, skipped = _gpu_types(_Ec2(quirky(types)), _ctx())
    checked = 0
    for name, it in types.items():
        gpus = (it.get("GpuInfo") or {}).get("Gpus") or []
        if not gpus or gpus[0]["Manufacturer"] != "NVIDIA" or not gpus[0]["Count"]:
            continue
        want = truth(it)
        if want[0] is None:
            assert name not in parsed and any(name in s for s in skipped), name
            continue
        assert (parsed[name].gpu, parsed[name].gpu_count) == want, name
        checked += 1
    assert checked > 40  # 47 with moto 5.2
    assert not any("NVIDIA (" in s for s in skipped)  # p5en is not dropped


@pytest.mark.parametrize(
    ("product", "kept"),
    [
        ("Virtual Machines NCasT4_v3 Series", True),
        ("Virtual Machines NCasT4_v3 Series Windows", False),
        ("Virtual Machines NC Series Win", False),
        ("Virtual Machines NV Series Basic Win", False),
        ("Virtual Machines Twin Series", True),  # a word that merely contains "Win"
    ],
)
def test_azure_windows_prices_are_dropped(product: str, kept: bool) -> None:
    from gpucloud.providers.azure.catalog import _add_price

    out: dict[tuple[str, str], list[float | None]] = {}
    _add_price(
        out,
        {
            "armSkuName": "Standard_NC4as_T4_v3",
            "armRegionName": "eastus",
            "skuName": "NC4as T4 v3",
            "productName": product,
            "unitOfMeasure": "1 Hour",
            "type": "Consumption",
            "retailPrice": 0.9,
        },
    )
    assert (out != {}) is kept
