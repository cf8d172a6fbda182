"""Planner: the first candidate is the cheapest offering meeting every constraint (checked against a
brute-force scan of the catalog), every exclusion has a reason, and unavailable GPUs fail clearly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucloud.catalog import load_catalog
from gpucloud.errors import UserError
from gpucloud.plan.planner import make_plan
from gpucloud.spec.load import JobSpec, Resources, load_spec
from tests.support.planner_oracle import brute_force_cheapest, job
from tests.support.sshd import example_hosts_lab, have_sshd

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


@pytest.fixture(scope="module")
def example_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The examples' placeholder SSH hosts (examples/k80-ssh.yaml), served by stub machines."""
    if not have_sshd():
        yield {}
        return
    lab = example_hosts_lab(tmp_path_factory.mktemp("example-hosts") / "lab")
    yield lab.env()
    lab.close()


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_plans(path: Path, example_hosts: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    spec = load_spec(path)
    clouds = spec.resources.cloud
    if spec.resources.hosts and not example_hosts:
        pytest.skip("needs /usr/sbin/sshd and ssh (openssh-server; .ci/run installs it)")
    for key, value in example_hosts.items():
        monkeypatch.setenv(key, value)
    plan = make_plan(spec, cloud="local" if clouds == ["local"] else None)
    assert plan.candidates, path
    assert plan.candidates == sorted(plan.candidates, key=lambda c: c.total_per_hour)
    for c in plan.candidates:
        assert c.total_per_hour == pytest.approx(c.price_per_hour * spec.num_nodes)
        assert c.estimated_cost == pytest.approx(c.total_per_hour * spec.max_duration / 3600, abs=0.01)


GPUS_OFFERED = sorted({o.gpu for o in load_catalog().offerings if o.status != "retired"}) + sorted(
    load_catalog().families
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gpu=st.sampled_from(GPUS_OFFERED),
    count=st.sampled_from([1, 1, 2, 4, 8]),
    clouds=st.sampled_from([["aws"], ["azure"], ["aws", "azure"]]),
    policy=st.sampled_from([False, True, "auto"]),
    max_price=st.one_of(st.none(), st.floats(0.1, 60.0)),
    min_vcpus=st.one_of(st.none(), st.sampled_from([4, 8, 24, 48])),
    regions=st.one_of(st.none(), st.sampled_from([["us-east-1"], ["eastus", "westus2"], ["eu-west-1", "westeurope"]])),
)
def test_first_candidate_is_brute_force_cheapest(
    gpu: str,
    count: int,
    clouds: list[str],
    policy: bool | str,
    max_price: float | None,
    min_vcpus: int | None,
    regions: list[str] | None,
) -> None:
    if regions and not any(r in load_catalog().regions(c) for c in clouds for r in regions):
        return  # every region of another cloud: a user error, covered below
    spec = job(
        gpu=f"{gpu}:{count}",
        cloud=clouds,
        spot=policy,
        max_price_per_hour=max_price,
        min_vcpus=min_vcpus,
        regions=regions,
    )
    expected = brute_force_cheapest(spec, policy)
    if expected is None:
        with pytest.raises(UserError):
            make_plan(spec)
        return
    plan = make_plan(spec)
    assert plan.candidates[0].price_per_hour == pytest.approx(expected)
    for c in plan.candidates:
        assert c.gpu in load_catalog().members(gpu) and c.gpu_count == count and c.cloud in clouds
        if policy is True:
            assert c.spot
        if policy is False:
            assert not c.spot
        if max_price is not None:
            assert c.price_per_hour <= max_price


def test_every_excluded_offering_has_a_reason() -> None:
    plan = make_plan(job(gpu="T4:1", cloud=["aws", "azure"]))
    assert len(plan.candidates) + len(plan.excluded) >= len(load_catalog().offerings)
    assert all(e.reason for e in plan.excluded)
    keys = {(c.cloud, c.region, c.instance_type) for c in plan.candidates}
    assert not keys & {(e.cloud, e.region, e.instance_type) for e in plan.excluded}


def test_spot_auto_keeps_on_demand_as_fallback() -> None:
    plan = make_plan(job(gpu="T4:1", cloud=["aws"], regions=["us-east-1"], spot="auto"))
    markets = [(c.instance_type, c.spot) for c in plan.candidates]
    assert ("g4dn.xlarge", True) in markets and ("g4dn.xlarge", False) in markets
    assert markets.index(("g4dn.xlarge", True)) < markets.index(("g4dn.xlarge", False))


def test_k40_is_offered_nowhere_and_alternatives_are_listed() -> None:
    with pytest.raises(UserError) as info:
        make_plan(job(gpu="K40:1"))
    text = info.value.render()
    assert "K40" in text and "never offered" in text
    # No Kepler GPU is offered any more (p2 withdrawn, NC v1 retired): the cheapest current GPU comes first.
    assert "T4" in text  # then the cheapest current GPU


def test_k80_on_azure_is_retired_only() -> None:
    with pytest.raises(UserError) as info:
        make_plan(job(gpu="K80:1", cloud=["azure"]))
    text = info.value.render()
    assert "retired" in text and "2023-09-06" in text
    assert "gpucloud stack K80" in text  # the stack knowledge stays


def test_k80_on_aws_says_p2_is_not_offered_and_keeps_the_stack() -> None:
    with pytest.raises(UserError) as info:
        make_plan(job(gpu="K80:1", cloud=["aws"]))
    text = info.value.render()
    assert "p2.xlarge, p2.8xlarge, p2.16xlarge (not offered as of 2026-12-03)" in text
    assert "current API does not offer them" in text and "no end date was announced" in text
    assert "gpucloud stack K80" in text and "cloud: ssh" in text and "examples/k80-ssh.yaml" in text


def test_family_name_matches_every_memory_variant_and_full_name_is_exact() -> None:
    plan = make_plan(job(gpu="A100:1"))
    assert {c.gpu for c in plan.candidates} == {"A100-80GB"}  # the only 1-GPU A100s; the plan names the variant
    plan8 = make_plan(job(gpu="A100:8"))
    assert {c.gpu for c in plan8.candidates} == {"A100-40GB", "A100-80GB"}
    assert {c.gpu for c in make_plan(job(gpu="A100-40GB:8")).candidates} == {"A100-40GB"}
    with pytest.raises(UserError):
        make_plan(job(gpu="A100-40GB:1"))


def test_budget_below_every_price_shows_closest_misses() -> None:
    with pytest.raises(UserError) as info:
        make_plan(job(gpu="A100-80GB:1", max_price_per_hour=0.5))
    text = info.value.render()
    assert "Closest misses" in text and "max_price_per_hour" in text
    assert "Standard_NC24ads_A100_v4" in text


def test_unknown_region_and_instance_type_are_user_errors() -> None:
    with pytest.raises(UserError) as info:
        make_plan(job(gpu="T4:1", regions=["us-east1"]))
    assert "Did you mean us-east-1" in info.value.render()
    spec = JobSpec(name="t", resources=Resources(instance_type="g4dn.xlarg"), run="true")
    with pytest.raises(UserError) as info:
        make_plan(spec)
    assert "Did you mean g4dn.xlarge" in info.value.render()


def test_instance_type_alone_resolves_its_gpu() -> None:
    spec = JobSpec(name="t", resources=Resources(instance_type="g5.xlarge", cloud=["aws"]), run="true")
    plan = make_plan(spec)
    assert {c.instance_type for c in plan.candidates} == {"g5.xlarge"}
    assert plan.stack.gpu == "A10G"


def test_num_nodes_multiplies_price() -> None:
    spec = job(gpu="T4:1", cloud=["aws"], regions=["us-east-1"])
    spec.num_nodes = 4
    c = make_plan(spec).candidates[0]
    assert c.total_per_hour == pytest.approx(4 * c.price_per_hour)


def test_local_plan_is_free_and_single() -> None:
    plan = make_plan(job(gpu="T4:1"), cloud="local")
    assert [(c.cloud, c.price_per_hour) for c in plan.candidates] == [("local", 0.0)]


def test_plan_json_shape() -> None:
    doc = json.loads(json.dumps(make_plan(job(gpu="T4:1", spot="auto")).as_json()))
    assert set(doc) == {"candidates", "excluded", "stack", "warnings", "notes", "catalog"}
    assert {"origin", "price_date", "age_days", "max_age_days", "stale"} <= set(doc["catalog"])
    assert set(doc["candidates"][0]) == {
        "arch",
        "cloud",
        "region",
        "instance_type",
        "gpu",
        "gpu_count",
        "num_nodes",
        "spot",
        "price_per_hour",
        "total_per_hour",
        "estimated_cost",
        "image",
        "request",
        "price_source",
    }
    assert set(doc["excluded"][0]) == {"cloud", "region", "instance_type", "reason"}
    assert set(doc["stack"]) == {"gpu", "architecture", "driver", "cuda", "cudnn", "os_image", "framework"}


def test_more_nodes_than_the_provider_runs_is_refused_at_plan_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider whose Capabilities say one node per job gets no two-node plan: the field and the fix."""
    from dataclasses import replace

    from gpucloud.errors import UserError
    from gpucloud.plan.planner import make_plan
    from gpucloud.providers.local.provider import LocalProvider
    from gpucloud.spec.load import parse_spec

    monkeypatch.setattr(LocalProvider, "capabilities", replace(LocalProvider.capabilities, multi_node=False))
    spec = parse_spec("name: a\nnum_nodes: 2\nresources: {cloud: local}\nrun: x\n", "job.yaml")
    with pytest.raises(UserError, match=r"num_nodes: local runs one node per job, and the job asks for 2"):
        make_plan(spec)
    assert make_plan(parse_spec("name: a\nresources: {cloud: local}\nrun: x\n", "job.yaml")).candidates
