"""`plan` says which network a multi-node candidate's nodes talk over: EFA with its interface count
on AWS, InfiniBand on Azure's RDMA sizes (not for spot: no availability set), accelerated networking
or TCP elsewhere; a one-node plan shows no fabric. The table has the column, `--json` the field."""

from __future__ import annotations

import json

import pytest

from gpucloud.plan.planner import make_plan
from gpucloud.spec.load import JobSpec, parse_spec


def spec_of(gpu: str, nodes: int, clouds: str = "[aws, azure]", spot: str = "false") -> JobSpec:
    return parse_spec(
        f"name: job\nresources:\n  cloud: {clouds}\n  gpu: {gpu}\n  spot: {spot}\nnum_nodes: {nodes}\n"
        "run: 'true'\nmax_duration: 1h\n",
        "job.yaml",
    )


def fabrics(spec: JobSpec) -> dict[tuple[str, str, bool], str | None]:
    doc = make_plan(spec, baked=False).as_json()
    return {(c["cloud"], c["instance_type"], c["spot"]): c.get("fabric") for c in doc["candidates"]}  # type: ignore[index, union-attr]


def test_a_two_node_h100_plan_names_efa_and_infiniband() -> None:
    got = fabrics(spec_of("H100:8", 2))
    assert got[("aws", "p5.48xlarge", False)] == "EFA ×32"
    assert got[("azure", "Standard_ND96isr_H100_v5", False)] == "InfiniBand"


@pytest.mark.parametrize(
    ("gpu", "itype", "want"),
    [("A100:8", "p4d.24xlarge", "EFA ×4"), ("T4:1", "g4dn.xlarge", "TCP"), ("T4:1", "g4dn.8xlarge", "EFA ×1")],
)
def test_aws_types_show_their_efa_count(gpu: str, itype: str, want: str) -> None:
    got = fabrics(spec_of(gpu, 2, "aws"))
    assert got[("aws", itype, False)] == want


def test_azure_spot_gets_no_infiniband() -> None:
    from gpucloud.plan.fabric import fabric_of

    assert fabric_of("azure", "Standard_ND96isr_H100_v5", False) == "InfiniBand"
    assert fabric_of("azure", "Standard_ND96isr_H100_v5", True) != "InfiniBand", "no availability set for spot"


def test_one_node_shows_no_fabric() -> None:
    got = fabrics(spec_of("H100:8", 1))
    assert got and set(got.values()) == {None}


def test_the_table_has_a_fabric_column_for_several_nodes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpucloud.ui import views

    monkeypatch.setenv("COLUMNS", "220")
    views.print_plan(make_plan(spec_of("H100:8", 2, "aws"), baked=False))
    text = capsys.readouterr().out
    assert "fabric" in text and "EFA ×32" in text, text[:2000]
    views.print_plan(make_plan(spec_of("H100:8", 1, "aws"), baked=False))
    one = capsys.readouterr().out
    header = next(line for line in one.splitlines() if "instance type" in line)
    assert "p5.48xlarge" in one and "EFA" not in one and "fabric" not in header, one[:2000]


def test_json_plan_is_plain_data() -> None:
    json.dumps(make_plan(spec_of("H100:8", 2), baked=False).as_json())
