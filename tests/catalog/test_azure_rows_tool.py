"""tools/azure_rows.py turns a stored copy of Azure's retail prices (karpenter-provider-azure's
generated Go table) into shipped Azure rows for every region (docs/CATALOG.md, "Shipped regions"):
the file's own date on every new row, estimates replaced by the sourced price, sourced rows and
retired sizes kept as they are, sizes the catalog cannot name left out, the result validated."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from gpucloud.catalog import validate_offerings_text
from gpucloud.catalog.prices import price_source

REPO = Path(__file__).resolve().parent.parent.parent
BASE = """cloud,instance_type,gpu,gpu_count,vcpus,memory_gib,arch,region,price_per_hour,spot_price_per_hour,status,\
status_date,status_basis,source,price_date
azure,Standard_NC4as_T4_v3,T4,1,4,28,x86_64,eastus,0.526,0.062699,active,2024,observed,skypilot v6 [S],2024
azure,Standard_NC4as_T4_v3,T4,1,4,28,x86_64,westeurope,0.6049,0.0721,active,2024,observed,"[estimate: x 1.15]",2024
azure,Standard_NC6s_v3,V100,1,6,112,x86_64,eastus,3.06,0.3978,retired,2025-09-30,announced,skypilot v6 [S],2024
aws,g4dn.xlarge,T4,1,4,16,x86_64,us-east-1,0.526,,active,2026-12-03,observed,price list [S],2026-08-26
"""
GO = """package pricing

// generated at 2026-06-18T03:43:41Z

func init() {
\t// eastus
\tinitialOnDemandPrices["eastus"] = map[string]float64{
\t\t"Standard_D2s_v5":          0.096000,
\t\t"Standard_NC4as_T4_v3":     0.526000,
\t}
\t// swedencentral
\tinitialOnDemandPrices["swedencentral"] = map[string]float64{
\t\t"Standard_NC4as_T4_v3":     0.600000,
\t\t"Standard_NC6s_v3":         3.500000,
\t\t"Standard_ND96isr_H200_v5": 110.272000,
\t\t"Standard_ND96isr_MI300X_v5": 60.000000,
\t}
\t// westeurope
\tinitialOnDemandPrices["westeurope"] = map[string]float64{
\t\t"Standard_NC4as_T4_v3":     0.658000,
\t}
}
"""


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("azure_rows", REPO / "tools" / "azure_rows.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tool_adds_every_priced_region_and_keeps_sourced_rows(tmp_path: Path) -> None:
    tool = _tool()
    (tmp_path / "zz_generated.pricing.go").write_text(GO)
    (tmp_path / "base.csv").write_text(BASE)
    before = validate_offerings_text(BASE)
    out = tmp_path / "offerings.csv"
    args = ["--prices", str(tmp_path / "zz_generated.pricing.go"), "--cite", "karpenter @abc1234"]
    assert tool.main([*args, "--base", str(tmp_path / "base.csv"), "--out", str(out)]) == 0
    rows = {(o.instance_type, o.region): o for o in validate_offerings_text(out.read_text())}
    old = {(o.instance_type, o.region): o for o in before}

    new = rows[("Standard_NC4as_T4_v3", "swedencentral")]
    assert (new.price_per_hour, new.spot_price_per_hour, new.gpu, new.vcpus, new.memory_gib) == (0.6, None, "T4", 4, 28)
    assert (new.price_date, new.status_date, new.status_basis) == ("2026-06-18", "2026-06-18", "observed")
    assert "karpenter @abc1234 [S]" in new.source and "sold in this region by its retail price" in new.source
    assert price_source(new).kind == "shipped"
    h200 = rows[("Standard_ND96isr_H200_v5", "swedencentral")]
    assert (h200.gpu, h200.gpu_count, h200.vcpus, h200.memory_gib, h200.price_per_hour) == (
        "H200",
        8,
        96,
        1850,
        110.272,
    )
    # The estimated row takes the sourced price and loses its guessed spot; sourced and retired rows stay.
    we = rows[("Standard_NC4as_T4_v3", "westeurope")]
    assert (we.price_per_hour, we.spot_price_per_hour, price_source(we).kind) == (0.658, None, "shipped")
    for key in (("Standard_NC4as_T4_v3", "eastus"), ("Standard_NC6s_v3", "eastus"), ("g4dn.xlarge", "us-east-1")):
        assert rows[key] == old[key]
    # Retired (NCv3), unnamed (MI300X) and non-GPU sizes are not added.
    assert set(rows) - set(old) == {
        ("Standard_NC4as_T4_v3", "swedencentral"),
        ("Standard_ND96isr_H200_v5", "swedencentral"),
    }


def test_a_file_that_is_not_the_generated_table_is_refused(tmp_path: Path) -> None:
    tool = _tool()
    bad = tmp_path / "x.go"
    bad.write_text("package pricing\n")
    (tmp_path / "base.csv").write_text(BASE)
    with pytest.raises(SystemExit, match="not a zz_generated.pricing.go"):
        tool.main(
            [
                "--prices",
                str(bad),
                "--cite",
                "x",
                "--base",
                str(tmp_path / "base.csv"),
                "--out",
                str(tmp_path / "o.csv"),
            ]
        )
    assert not (tmp_path / "o.csv").exists()
