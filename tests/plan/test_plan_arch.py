"""resources.arch: x86_64 by default, so an "any GPU" job does not start on a Graviton (arm64)
machine whose wheels and containers most jobs do not have; `arch: arm64` or `any` opens those rows.
The rule holds in the planner's full check and in its SQL mirror (the refreshed catalog file), the
exclusion names the field that opens it, every candidate carries its arch (table and JSON), and the
nearest alternatives of a refused GPU offer an arm64 machine only to a job that accepts one."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from gpucloud.errors import UserError
from gpucloud.plan.planner import make_plan
from gpucloud.spec.load import json_schema, parse_spec
from gpucloud.spec.values import SpecError
from tests.support.catalog_files import file_and_memory, grown_rows

ANY_GPU = "name: anygpu\nresources:\n  gpu: {{memory: 1GB.., count: 1..8}}\n{extra}run: 'true'\n"
ARM_REASON = "arm64 (resources.arch: arm64 or any opens it)"


def any_gpu(extra: str = "") -> str:
    return ANY_GPU.format(extra=extra)


def test_any_gpu_picks_an_x86_64_machine_first_and_names_the_arm64_rows_it_left_out() -> None:
    plan = make_plan(parse_spec(any_gpu(), "job.yaml"), baked=False)
    assert plan.candidates[0].arch == "x86_64"
    assert {c.arch for c in plan.candidates} == {"x86_64"}
    arm = [e for e in plan.excluded if e.instance_type.startswith("g5g.")]
    assert arm and all(e.reason == ARM_REASON for e in arm)


@pytest.mark.parametrize("arch", ["arm64", "any", "aarch64", "ANY"])
def test_arch_arm64_or_any_opens_the_graviton_rows(arch: str) -> None:
    plan = make_plan(parse_spec(any_gpu(f"  arch: {arch}\n"), "job.yaml"), baked=False)
    first = plan.candidates[0]
    assert (first.arch, first.gpu) == ("arm64", "T4G"), first
    if arch.lower() != "any":
        assert {c.arch for c in plan.candidates} == {"arm64"}
        x86 = [e for e in plan.excluded if e.instance_type.startswith("g4dn.")]
        assert x86 and all(e.reason == "x86_64 (resources.arch: x86_64 or any opens it)" for e in x86)


def test_arch_is_validated_and_described_in_the_schema() -> None:
    with pytest.raises(SpecError) as exc:
        parse_spec(any_gpu("  arch: arm\n"), "job.yaml")
    text = str(exc.value)
    assert "job.yaml:4: resources.arch:" in text and "Did you mean 'arm64'?" in text
    prop = json_schema()["$defs"]["Resources"]["properties"]["arch"]
    assert prop["enum"] == ["x86_64", "arm64", "any"] and prop["default"] == "x86_64"
    assert "x86_64" in prop["description"] and "arm64" in prop["description"]


def test_plan_json_and_table_show_each_candidates_arch() -> None:
    from gpucloud.ui import views

    plan = make_plan(parse_spec(any_gpu("  arch: any\n"), "job.yaml"), baked=False)
    doc = json.loads(json.dumps(plan.as_json()))
    assert [c["arch"] for c in doc["candidates"][:2]] == ["arm64", "arm64"]
    assert {c["arch"] for c in doc["candidates"]} == {"arm64", "x86_64"}
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()), pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "160")
        views.print_plan(plan)
    lines = out.getvalue().splitlines()
    header = next(line for line in lines if line.startswith("#"))
    first = next(line for line in lines if line.startswith("1 "))
    assert "arch" in header.split() and "arm64" in first.split(), out.getvalue()
    narrow = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(narrow), pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "80")
        views.print_plan(plan)
    assert "column(s) arch" in " ".join(narrow.getvalue().split())  # the first to give way


@pytest.mark.parametrize("gpu", ["K80", "V100", "K80:2"])
@pytest.mark.parametrize("cloud", ["aws", "any"])
def test_nearest_alternatives_offer_arm64_only_to_a_job_that_accepts_it(gpu: str, cloud: str) -> None:
    for extra, arm_allowed in (("", False), ("  arch: any\n", True)):
        text = f"name: j\nresources:\n  cloud: {cloud}\n  gpu: {gpu}\n{extra}run: 'true'\n"
        with pytest.raises(UserError) as exc:
            make_plan(parse_spec(text, "job.yaml"), baked=False)
        hint = " ".join((exc.value.hint or "").split())
        assert "Nearest alternatives: " in hint, exc.value.render()
        first = hint.split("Nearest alternatives: ", 1)[1].split(";")[0]
        assert ("g5g." in hint) == arm_allowed, hint
        if not arm_allowed:
            assert "T4G" not in first, first


@pytest.mark.parametrize("extra", ["", "  arch: arm64\n", "  arch: any\n"])
def test_the_arch_rule_plans_through_the_catalog_file_as_in_memory(extra: str, tmp_path: Path) -> None:
    """The SQL mirror (catalog/ranking.py RuleSql) and the per-pair sums (catalog/offerings_db.py, not split
    by arch) give what the full check of the rows in memory gives."""
    rows = grown_rows(4, "regions")
    indexed, memory, spec = file_and_memory(rows, any_gpu(extra), tmp_path)
    from_memory = make_plan(spec, catalog=memory, baked=False)
    from_index = make_plan(spec, catalog=indexed, baked=False)
    assert from_index.candidates[:10] == from_memory.candidates[:10]
    assert list(from_index.candidates) == list(from_memory.candidates)
    assert list(from_index.excluded) == list(from_memory.excluded)
    wanted = {"": {"x86_64"}, "  arch: arm64\n": {"arm64"}}.get(extra, {"x86_64", "arm64"})
    assert {c.arch for c in from_index.candidates} == wanted
    t4 = "name: t\nresources:\n  gpu: T4:1\n" + extra + "run: 'true'\n"
    indexed, memory, spec = file_and_memory(rows, t4, tmp_path)  # one GPU: counted from the sums
    if extra == "  arch: arm64\n":
        for cat in (indexed, memory):
            with pytest.raises(UserError, match="no offering meets"):
                make_plan(spec, catalog=cat, baked=False)
        return
    assert list(make_plan(spec, catalog=indexed, baked=False).candidates) == list(
        make_plan(spec, catalog=memory, baked=False).candidates
    )
