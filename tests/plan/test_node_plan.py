"""A machine's image and install plan is worked out once, by the plan (Plan.node_for), and the
user-data's stack stage is given exactly that: render does not work it out again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucloud.contract import registry as providers
from gpucloud.plan import images
from gpucloud.plan.planner import make_plan
from gpucloud.spec.load import load_spec
from gpucloud.vm.render import render_node

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("example", ["ngc-pytorch.yaml", "quickstart.yaml"])
@pytest.mark.parametrize("cloud", ["aws", "azure"])
def test_the_install_plan_is_worked_out_once_and_rendered_as_planned(
    example: str, cloud: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    worked: list[tuple[object, ...]] = []
    resolve = images.resolve_node

    def counted(*args: object, **kwargs: object) -> images.NodeStack:
        worked.append(args[1:4])
        return resolve(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(images, "resolve_node", counted)
    spec = load_spec(EXAMPLES / example)
    plan = make_plan(spec, cloud=cloud, baked=False)
    first = plan.candidates[0]
    node = plan.node_for(first)
    out = render_node(spec, plan, first, caps=providers.capabilities(first.cloud))
    assert plan.node_for(first) is node
    assert worked == [(first.cloud, first.instance_type, first.gpu_count)]  # the plan's, and no other
    stack = json.loads(out.job_json)["stack"]
    assert stack["driver_packages"] == list(node.driver_packages)
    assert stack["cuda_packages"] == list(node.cuda_packages)
    assert stack["image_name"] == (node.image.name if node.image else "default")
