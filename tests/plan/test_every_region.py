"""Every region of the shipped catalog plans, and a region the catalog lacks is answered for what it
is (docs/CATALOG.md, "Shipped regions"): a real region's name gets the refresh command, a typo gets
"Did you mean"; both exit 2.

The plan tests run in-process (make_plan on the shipped file, no refresh, no credentials): one per
(cloud, region) with an active row, for a T4 job where the region sells a T4, else for the
cheapest x86_64 GPU there (with its GPU count); and, for Azure, a T4 job and an A100 job in each
region where Azure's retail prices (the shipped rows' source) sell those GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpucloud.catalog import shipped_catalog
from gpucloud.catalog.regions import edit_distance, unknown_region
from gpucloud.cli.app import app
from gpucloud.contract import registry as providers
from gpucloud.errors import UserError
from gpucloud.plan.planner import make_plan
from gpucloud.spec.load import GpuRequest, JobSpec, Resources


def _region_gpus() -> list[tuple[str, str, str, int]]:
    """(cloud, region, GPU, count to ask for) for every region with an active row of a priced cloud."""
    out = []
    rows = [o for o in shipped_catalog().offerings if o.status == "active" and o.arch == "x86_64"]
    for cloud in providers.priced_clouds():
        for region in sorted({o.region for o in rows if o.cloud == cloud}):
            here = [o for o in rows if o.cloud == cloud and o.region == region]
            t4 = [o for o in here if o.gpu == "T4"]
            pick = min(t4 or here, key=lambda o: (o.gpu_count, o.price_per_hour))
            out.append((cloud, region, pick.gpu, pick.gpu_count))
    return out


REGION_GPUS = _region_gpus()


def _job(gpu: str, cloud: str, regions: list[str], count: int = 1) -> JobSpec:
    res = Resources(cloud=[cloud], regions=regions)  # type: ignore[arg-type]
    res.gpu = GpuRequest(model=gpu, count=count)
    return JobSpec(name="t", resources=res, run="true", max_duration=3600)


# Where Azure sells a T4 size (NCasT4_v3) and an A100 size (NC A100 v4, ND A100 v4), per the Azure
# Retail Prices copy the shipped Azure rows come from (docs/CATALOG.md, "Shipped regions").
AZURE_T4_REGIONS = (
    "australiacentral australiacentral2 australiaeast brazilsouth canadacentral centralindia centralus eastus "
    "eastus2 francecentral germanywestcentral israelcentral italynorth japaneast japanwest koreacentral "
    "malaysiawest northcentralus northeurope polandcentral southcentralus southeastasia southindia swedencentral "
    "uksouth westeurope westus westus2 westus3"
).split()
AZURE_A100_REGIONS = (
    "australiaeast brazilsouth canadacentral canadaeast centralindia centralus eastus eastus2 francecentral "
    "germanynorth germanywestcentral italynorth japaneast japanwest jioindiacentral jioindiawest koreacentral "
    "northcentralus northeurope norwayeast polandcentral southafricanorth southcentralus southeastasia southindia "
    "spaincentral swedencentral switzerlandnorth switzerlandwest uaecentral uaenorth uksouth ukwest westeurope "
    "westus westus2 westus3"
).split()


def test_the_shipped_catalog_covers_the_gpu_regions_of_both_clouds() -> None:
    """Every region moto's bundled AWS data lists for a GPU type the catalog knows, and every region
    Azure's retail prices sell an NVIDIA size the catalog knows in (50; Azure's own name for each)."""
    regions = {(c, r) for c, r, _, _ in REGION_GPUS}
    assert len({r for c, r in regions if c == "aws"}) >= 28
    for r in ("eu-central-1", "us-east-2", "ap-south-1", "sa-east-1", "me-central-1", "il-central-1"):
        assert ("aws", r) in regions, r
    assert len({r for c, r in regions if c == "azure"}) >= 50
    for r in ("eastus2", "westeurope", "swedencentral", "japaneast", "uaenorth", "qatarcentral", "mexicocentral"):
        assert ("azure", r) in regions, r


@pytest.mark.parametrize(
    ("gpu", "region"),
    [("T4", r) for r in AZURE_T4_REGIONS] + [("A100", r) for r in AZURE_A100_REGIONS],
    ids=[f"T4-{r}" for r in AZURE_T4_REGIONS] + [f"A100-{r}" for r in AZURE_A100_REGIONS],
)
def test_an_azure_t4_or_a100_job_plans_in_each_region_that_sells_it(gpu: str, region: str) -> None:
    """Candidates there (at the smallest GPU count sold there), each priced from a dated source (shown
    as `shipped DATE`, never an estimate) and booting an image."""
    here = [
        o for o in shipped_catalog().offerings if o.cloud == "azure" and o.region == region and o.status == "active"
    ]
    count = min((o.gpu_count for o in here if o.gpu.startswith(gpu)), default=1)  # ND A100 alone: 8
    plan = make_plan(_job(gpu, "azure", [region], count))
    assert plan.candidates, (gpu, region)
    assert {c.region for c in plan.candidates} == {region}
    assert all(c.gpu.startswith(gpu) and c.image is not None for c in plan.candidates)
    sources = {(c.price_source.kind, c.price_source.date) for c in plan.candidates if c.price_source}
    assert {kind for kind, _ in sources} == {"shipped"} and all(date >= "2024" for _, date in sources), sources


@pytest.mark.parametrize(
    ("cloud", "region", "gpu", "count"), REGION_GPUS, ids=[f"{c}-{r}" for c, r, _, _ in REGION_GPUS]
)
def test_a_job_in_each_gpu_region_has_candidates_there(cloud: str, region: str, gpu: str, count: int) -> None:
    plan = make_plan(_job(gpu, cloud, [region], count))
    assert plan.candidates, (cloud, region, gpu, count)
    assert {(c.cloud, c.region) for c in plan.candidates} == {(cloud, region)}
    assert all(c.gpu == gpu or c.gpu.startswith(gpu) for c in plan.candidates)


def test_every_shipped_azure_size_has_a_quota_family() -> None:
    """Quota families are per size, not per region: a size sold in a new region is read against its
    family's quota there before a launch (providers/azure/quota.py)."""
    from gpucloud.providers.azure.quota import family_of

    sizes = {o.instance_type for o in shipped_catalog().offerings if o.cloud == "azure" and o.status == "active"}
    assert sizes and not {s for s in sizes if family_of(s) is None}


@pytest.mark.parametrize(
    ("name", "cloud", "near"),
    [
        ("mx-central-1", "aws", "me-central-1"),
        ("ap-southeast-7", "aws", "ap-southeast-1"),
        ("us-gov-west-1", "aws", None),
        ("belgiumcentral", "azure", None),
        ("eastsu", "azure", "eastus"),
    ],
)
def test_a_region_shaped_name_gets_the_refresh_command(name: str, cloud: str, near: str | None) -> None:
    """Real regions the shipped file lacks (Mexico, Thailand, GovCloud, Belgium) are not typos, even one
    key from a known region; that region is offered as well."""
    with pytest.raises(UserError) as info:
        make_plan(_job("T4", cloud, [name]))
    text = info.value.render()
    assert f"region '{name}' is not in the catalog you have: `gpucloud catalog refresh --region {name}`" in text
    assert "not one gpucloud knows" not in text
    assert (f"Did you mean {near}" in text) if near else ("Did you mean" not in text)
    assert info.value.exit_code == 2


@pytest.mark.parametrize(
    ("name", "suggested"), [("us-east1", "us-east-1"), ("eu-west1", "eu-west-1"), ("eu-west", "eu-west-1")]
)
def test_a_name_not_shaped_like_a_region_gets_did_you_mean(name: str, suggested: str) -> None:
    with pytest.raises(UserError) as info:
        make_plan(_job("T4", "aws", [name]))
    text = info.value.render()
    assert "is not one gpucloud knows" in text and "Did you mean" in text and suggested in text
    assert "catalog refresh" not in text
    assert info.value.exit_code == 2


def test_unknown_region_without_a_catalog_file() -> None:
    """The same answers from the known regions alone (what `catalog --region` passes)."""
    known = {"aws": ["us-east-1", "us-west-2"], "azure": ["eastus"]}
    text = unknown_region("us-west-3", "--region", known).render()
    assert "--region: region 'us-west-3' is not in the catalog you have" in text
    assert "Did you mean us-west-2? If not: the refresh reads aws's offerings there" in text
    text = unknown_region("x", "--region", known).render()
    assert "Known regions: eastus, us-east-1, us-west-2." in text


def test_edit_distance_counts_a_swap_as_one_edit() -> None:
    assert edit_distance("eastsu", "eastus") == 1
    assert edit_distance("us-east1", "us-east-1") == 1
    assert edit_distance("us-east-1", "us-east-1") == 0
    assert edit_distance("eu-central-1", "eu-west-1") > 1


def test_plan_and_catalog_commands_give_the_refresh_hint_with_exit_2(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: t\nresources:\n  gpu: T4\n  regions: [mx-central-1]\nrun: nvidia-smi\n")
    res = CliRunner().invoke(app, ["plan", str(job)])
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert "resources.regions: region 'mx-central-1' is not in the catalog you have" in text
    assert "gpucloud catalog refresh --region mx-central-1" in text and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["plan", "--region", "belgiumcentral", str(job)])
    assert res.exit_code == 2 and "gpucloud catalog refresh --region belgiumcentral" in " ".join(res.output.split())
    res = CliRunner().invoke(app, ["catalog", "--region", "eu-central-2x"])
    assert res.exit_code == 2 and "Did you mean eu-central-2?" in " ".join(res.output.split())
    res = CliRunner().invoke(app, ["catalog", "--region", "mx-central-1"])
    assert res.exit_code == 2 and "gpucloud catalog refresh --region mx-central-1" in " ".join(res.output.split())
