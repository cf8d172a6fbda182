"""GPU alternatives and ranges (`gpu: [L4:1, A10G:1]`, `A100|H100:8`, `{memory: 24GB.., count: 1..4}`):
the job file's forms and their line-numbered errors, and the planner's ranking across them, checked
against a brute-force scan over random catalogs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucloud.catalog import Catalog, shipped_catalog
from gpucloud.catalog.models import Offering
from gpucloud.catalog.rows import MemoryRows
from gpucloud.errors import UserError
from gpucloud.plan.planner import make_plan
from gpucloud.spec.gpu import GpuRequest
from gpucloud.spec.load import JobSpec, SpecError, json_schema, parse_spec

SHIPPED = shipped_catalog()
GPUS = sorted(SHIPPED.gpus)


def spec_of(gpu: str, extra: str = "") -> JobSpec:
    return parse_spec(f"name: job\nresources:\n  gpu: {gpu}\n{extra}run: 'true'\nmax_duration: 1h\n", "job.yaml")


# ---------------------------------------------------------------------------------------------
# The job file


@pytest.mark.parametrize(
    ("text", "labels"),
    [
        ("T4:1", ["T4:1"]),
        ("[L4:1, A10G:1, T4:1]", ["L4:1", "A10G:1", "T4:1"]),
        ("A100|H100:8", ["A100|H100:8"]),
        ("L4:1..2", ["L4:1..2"]),
        ("'{memory: 24GB.., count: 1..4}'", None),
        ("{memory: 24GB.., count: 1..4}", ["any(24GB..):1..4"]),
        ("{memory: 24GB..80GB, count: 2..}", ["any(24GB..80GB):2..16"]),
        ("{model: [A10G, L4], count: 1}", ["A10G|L4:1"]),
        ("[T4:1, {memory: ..48GB, count: 4}]", ["T4:1", "any(..48GB):4"]),
    ],
)
def test_gpu_forms(text: str, labels: list[str] | None) -> None:
    if labels is None:  # a quoted mapping is a string: not a GPU request
        with pytest.raises(SpecError):
            spec_of(text)
        return
    spec = spec_of(text)
    assert [r.label() for r in spec.resources.gpu_requests] == labels
    assert spec.resources.gpu == spec.resources.gpu_requests[0]
    again = JobSpec.model_validate(spec.model_dump(mode="json"))  # a run's stored spec reads back the same
    assert again.resources.gpu_requests == spec.resources.gpu_requests


def test_plain_request_dumps_as_before() -> None:
    assert spec_of("T4:2").model_dump(mode="json")["resources"]["gpu"] == {"model": "T4", "count": 2}


@pytest.mark.parametrize(
    ("gpu", "line", "field", "words"),
    [
        ("[T4:1, Z80:2]", 3, "resources.gpu[1].model", "unknown GPU 'Z80'"),
        ("\n    - T4:1\n    - K80:0", 5, "resources.gpu[1].count", "must be at least 1, got 0"),
        ("\n    - T4:1\n    - 80", 5, "resources.gpu[1]", "got the number 80"),
        ("[]", 3, "resources.gpu", "the list is empty"),
        ("{memory: lots}", 3, "resources.gpu.memory", "is not a GPU memory range"),
        ("\n    model: T4\n    count: 4..2", 5, "resources.gpu.count", "the range 4..2 is empty"),
        ("\n    model: T4\n    count: 1...x", 5, "resources.gpu.count", "is not a count range"),
        ("A100|Z100:8", 3, "resources.gpu.other_models[0]", "unknown GPU 'Z100'"),
    ],
)
def test_bad_requests_name_line_and_field(gpu: str, line: int, field: str, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        spec_of(gpu)
    rendered = [str(i) for i in caught.value.issues]
    assert any(r.startswith(f"job.yaml:{line}: {field}: ") and words in r for r in rendered), rendered


def test_gpu_order_is_validated() -> None:
    assert spec_of("[L4:1, T4:1]", "  gpu_order: ordered\n").resources.gpu_order == "ordered"
    with pytest.raises(SpecError) as caught:
        spec_of("[L4:1, T4:1]", "  gpu_order: first\n")
    assert "resources.gpu_order" in str(caught.value)


def test_schema_accepts_the_new_forms() -> None:
    schema = json_schema()
    gpu = schema["$defs"]["Resources"]["properties"]["gpu"]
    text = json.dumps(gpu)
    assert '"type": "array"' in text and "memory" in json.dumps(schema["$defs"]["GpuRequest"])
    assert "gpu_order" in schema["$defs"]["Resources"]["properties"]


# ---------------------------------------------------------------------------------------------
# The planner


def test_plan_shows_which_request_each_candidate_meets() -> None:
    plan = make_plan(spec_of("[L4:1, A10G:1, T4:1]", "  cloud: aws\n"), baked=False)
    requests = {c.gpu: c.request for c in plan.candidates}
    assert requests == {"L4": "L4:1", "A10G": "A10G:1", "T4": "T4:1"}
    doc = plan.as_json()
    assert all(c["request"] and c["price_source"]["kind"] for c in doc["candidates"])  # type: ignore[index]
    reasons = [e.reason for e in plan.excluded if e.cloud == "aws"]
    assert any(r.startswith("has K80, job asks for L4:1, A10G:1 or T4:1") for r in reasons)


def test_each_alternative_gets_its_own_stack() -> None:
    plan = make_plan(spec_of("[K80:1, H100:1]", "  cloud: [aws, azure]\n"), baked=False)
    by_gpu = {c.gpu: plan.stack_for(c) for c in plan.candidates}
    assert {"K80", "H100"} <= set(by_gpu) or len(by_gpu) >= 1
    for gpu, stack in by_gpu.items():
        assert stack.gpu == gpu or gpu in SHIPPED.members(stack.gpu)
    doc = plan.as_json()
    if len(plan.stacks) > 1:
        assert set(doc["stacks"]) == set(plan.stacks)  # type: ignore[arg-type]


def test_ordered_puts_the_list_order_before_price() -> None:
    cheapest = make_plan(spec_of("[A10G:1, T4:1]", "  cloud: aws\n"), baked=False)
    ordered = make_plan(spec_of("[A10G:1, T4:1]", "  cloud: aws\n  gpu_order: ordered\n"), baked=False)
    assert cheapest.candidates[0].gpu == "T4"  # T4 is cheaper
    assert ordered.candidates[0].gpu == "A10G"
    assert sorted(map(str, cheapest.candidates)) == sorted(map(str, ordered.candidates))


def test_ranges_in_count_and_memory() -> None:
    plan = make_plan(spec_of("{memory: 40GB.., count: 2..4}", "  cloud: aws\n"), baked=False)
    for c in plan.candidates:
        assert 2 <= c.gpu_count <= 4 and SHIPPED.gpus[c.gpu].memory_gib >= 40


def test_the_planner_asks_the_request_what_its_memory_range_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory range is one rule (GpuRequest.takes_memory): the planner's match reads it."""
    request = spec_of("{memory: 24GB..80GB, count: 1..8}").resources.gpu_requests[0]
    assert [request.takes_memory(gib) for gib in (16, 24, 80, 80.5)] == [False, True, True, False]
    asked: list[float] = []

    def only_24(self: GpuRequest, gib: float) -> bool:
        asked.append(gib)
        return gib == 24

    monkeypatch.setattr(GpuRequest, "takes_memory", only_24)
    plan = make_plan(spec_of("{memory: 16GB.., count: 1..8}", "  cloud: aws\n"), baked=False)
    assert asked and {SHIPPED.gpus[c.gpu].memory_gib for c in plan.candidates} == {24}


def test_a_pin_that_fits_one_alternative_excludes_the_other() -> None:
    spec = spec_of("[H100:1, T4:1]", "  cloud: aws\nstack:\n  driver: '470'\n")
    plan = make_plan(spec, baked=False)
    assert {c.gpu for c in plan.candidates} == {"T4"}
    assert any("stack pins do not fit the H100" in e.reason for e in plan.excluded)
    with pytest.raises(UserError):  # a single request keeps stopping at a pin that does not fit it
        make_plan(spec_of("H100:1", "  cloud: aws\nstack:\n  driver: '470'\n"), baked=False)


def test_nothing_fits_any_alternative_says_so() -> None:
    with pytest.raises(UserError) as caught:
        make_plan(spec_of("[T4:1, L4:1]", "  cloud: aws\n  max_price_per_hour: 0.01\n"), baked=False)
    assert "no offering meets every constraint" in str(caught.value)


# ---------------------------------------------------------------------------------------------
# Property: over random catalogs and random requests, the first candidate is a brute-force cheapest


REGIONS = {"aws": ["us-east-1", "eu-west-1"], "azure": ["eastus", "westeurope"]}


@st.composite
def catalogs(draw: st.DrawFn) -> Catalog:
    rows = []
    for i in range(draw(st.integers(1, 40))):
        cloud = draw(st.sampled_from(sorted(REGIONS)))
        count = draw(st.sampled_from([1, 1, 2, 4, 8]))
        price = round(count * draw(st.floats(0.06, 15.0)), 4)
        spot = draw(st.one_of(st.none(), st.floats(0.2, 1.0)))
        rows.append(
            Offering(
                cloud=cloud,
                instance_type=f"t{i}",
                gpu=draw(st.sampled_from(GPUS)),
                gpu_count=count,
                vcpus=draw(st.sampled_from([4, 8, 32, 96])),
                memory_gib=64.0,
                arch="x86_64",
                region=draw(st.sampled_from(REGIONS[cloud])),
                price_per_hour=price,
                spot_price_per_hour=round(price * spot, 4) if spot is not None else None,
                status=draw(st.sampled_from(["active", "active", "legacy", "retired"])),
                status_date="2026-12-01",
                status_basis="observed",
                source="test [S]",
                price_date="2026-12-01",
            )
        )
    return dataclasses.replace(SHIPPED, rows=MemoryRows(rows))


@st.composite
def requests(draw: st.DrawFn) -> str:
    items = []
    for _ in range(draw(st.integers(1, 3))):
        low = draw(st.sampled_from([1, 1, 2, 4]))
        count = str(low) if draw(st.booleans()) else f"{low}..{draw(st.sampled_from([low, 4, 8]))}"
        if draw(st.booleans()):
            models = "|".join(draw(st.lists(st.sampled_from(GPUS), min_size=1, max_size=2, unique=True)))
            items.append(f"'{models}:{count}'")
        else:
            gb = draw(st.sampled_from([12, 16, 24, 40, 80]))
            memory = f"{gb}GB.." if draw(st.booleans()) else f"..{gb}GB"
            items.append(f"{{memory: '{memory}', count: '{count}'}}")
    return "[" + ", ".join(items) + "]"


def brute_force(spec: JobSpec, cat: Catalog, policy: bool | str) -> float | None:
    """The cheapest $/h of an offering meeting any request (under `ordered`: the first request any
    offering meets), written from the request's fields, not the planner's matcher."""
    res = spec.resources
    for_request: list[float | None] = []
    for req in res.gpu_requests:
        best: float | None = None
        names = {n for m in req.models for n in cat.members(m)} if req.models else set(cat.gpus)
        most = req.max_count or req.count
        for o in cat.rows.all():
            if o.cloud not in res.cloud or o.status == "retired" or o.gpu not in names:
                continue
            if not req.count <= o.gpu_count <= most:
                continue
            if req.memory is not None:
                low, high = req.memory
                mem = cat.gpus[o.gpu].memory_gib
                if mem < low or (high is not None and mem > high):
                    continue
            if res.min_vcpus and o.vcpus < res.min_vcpus:
                continue
            prices = {
                False: [o.price_per_hour],
                True: [o.spot_price_per_hour] if o.spot_price_per_hour is not None else [],
                "auto": [p for p in (o.price_per_hour, o.spot_price_per_hour) if p is not None],
            }[policy]  # type: ignore[index]
            for p in prices:
                if res.max_price_per_hour is not None and p > res.max_price_per_hour:
                    continue
                best = p if best is None else min(best, p)
        for_request.append(best)
    found = [p for p in for_request if p is not None]
    if not found:
        return None
    return found[0] if res.gpu_order == "ordered" else min(found)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cat=catalogs(),
    gpu=requests(),
    policy=st.sampled_from([False, True, "auto"]),
    order=st.sampled_from(["cheapest", "ordered"]),
    max_price=st.one_of(st.none(), st.floats(0.5, 60.0)),
    min_vcpus=st.one_of(st.none(), st.sampled_from([8, 32])),
)
def test_first_candidate_is_brute_force_cheapest_over_random_catalogs(
    cat: Catalog, gpu: str, policy: bool | str, order: str, max_price: float | None, min_vcpus: int | None
) -> None:
    extra = f"  cloud: [aws, azure]\n  spot: {str(policy).lower()}\n  gpu_order: {order}\n"
    extra += f"  max_price_per_hour: {max_price}\n" if max_price is not None else ""
    extra += f"  min_vcpus: {min_vcpus}\n" if min_vcpus is not None else ""
    spec = spec_of(gpu, extra)
    expected = brute_force(spec, cat, policy)
    if expected is None:
        with pytest.raises(UserError):
            make_plan(spec, catalog=cat, baked=False)
        return
    plan = make_plan(spec, catalog=cat, baked=False)
    assert plan.candidates[0].price_per_hour / expected == 1.0
    labels = [r.label() for r in spec.resources.gpu_requests]
    for c in plan.candidates:
        assert c.request in labels
    every = {(c.cloud, c.region, c.instance_type) for c in plan.candidates}
    assert len(every) + len(list(plan.excluded)) == len(cat.rows)  # each row a candidate or excluded


def test_examples_dir_has_an_alternatives_example() -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "any-24gb.yaml"
    from gpucloud.spec.load import load_spec

    plan = make_plan(load_spec(path), baked=False)
    assert plan.candidates and all(c.request for c in plan.candidates)


# ---------------------------------------------------------------------------------------------
# Prices that say what they are


def test_every_candidate_carries_its_price_source_and_no_estimates_refuses_them() -> None:
    from gpucloud.catalog.prices import price_source

    spec = spec_of("B200:8")  # p6-b200.48xlarge: priced in most regions, estimated in three
    plan = make_plan(spec, baked=False)
    kinds = {c.price_source.kind for c in plan.candidates if c.price_source}
    assert len(kinds) >= 2 and "estimate" in kinds and all(c.price_source for c in plan.candidates)
    strict = make_plan(spec, baked=False, estimates=False)
    assert strict.candidates and all(c.price_source and c.price_source.kind != "estimate" for c in strict.candidates)
    refused = [e for e in strict.excluded if "--no-estimates" in e.reason]
    assert refused and all("price is an estimate (" in e.reason for e in refused)
    rows = {(o.cloud, o.region, o.instance_type): o for o in SHIPPED.offerings}
    for e in refused:
        assert price_source(rows[(e.cloud, e.region, e.instance_type)]).kind == "estimate"


def test_plan_table_marks_estimated_prices_and_names_the_source() -> None:
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from gpucloud.ui import views

    plan = make_plan(spec_of("B200:8"), baked=False)
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        views.print_plan(plan, show_all=True)
    text = out.getvalue()
    estimates = sum(1 for c in plan.candidates if c.price_source and c.price_source.kind == "estimate")
    assert text.count("(estimate price)") == estimates > 0


def test_gpus_compares_per_gpu_hour_and_says_where_each_price_comes_from() -> None:
    from gpucloud.ui.catalog import gpu_summaries

    for s in gpu_summaries(SHIPPED):
        if s.on_demand is None:
            continue
        doc = s.as_json()["cheapest_on_demand"]
        assert doc["price_per_gpu_hour"] == pytest.approx(s.on_demand.price_per_hour / s.on_demand.gpu_count)
        assert doc["price_source"]["kind"] in {"shipped", "estimate", "live", "old"}
        live = [o for o in SHIPPED.offerings if o.gpu == s.name and o.status != "retired"]
        assert doc["price_per_gpu_hour"] == pytest.approx(min(o.price_per_hour / o.gpu_count for o in live))
