"""A VM stage is declared once, with its timeline group (gpucloud/vm/protocol.py STAGE_GROUPS): the
timeline's groups are read from there, and every stage the agent opens is one of them."""

from __future__ import annotations

import ast
from collections.abc import Sequence

from gpucloud.ui import timeline
from gpucloud.vm import protocol
from tests.support.source_tree import package_dir

AGENT = package_dir() / "vm" / "agent"
OPENERS = ("stage", "stage_always", "begin_stage")  # the agent's calls that open a stage by name


def group_problems(stage_groups: Sequence[tuple[str, ...]]) -> list[str]:
    """The declared stages that name no timeline group, or that are declared twice."""
    bare = [entry[0] for entry in stage_groups if len(entry) != 2 or not entry[1]]
    problems = [f"stage {name!r} has no timeline group" for name in bare]
    names = [entry[0] for entry in stage_groups]
    problems += [f"stage {name!r} is declared twice" for name in sorted({n for n in names if names.count(n) > 1})]
    return problems


def agent_stages() -> dict[str, str]:
    """Stage name -> where the agent opens it (file:line), from its source."""
    found: dict[str, str] = {}
    for path in sorted(AGENT.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in OPENERS
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                found.setdefault(node.args[0].value, f"{path.name}:{node.lineno}")
    return found


def test_every_stage_has_one_timeline_group() -> None:
    assert not group_problems(protocol.STAGE_GROUPS)


def test_a_stage_without_a_group_is_found() -> None:
    seeded = (*protocol.STAGE_GROUPS, ("new_stage", ""), ("other",), ("run", "run"))
    assert group_problems(seeded) == [
        "stage 'new_stage' has no timeline group",
        "stage 'other' has no timeline group",
        "stage 'run' is declared twice",
    ]


def test_the_timeline_reads_its_groups_from_the_protocol_in_its_order() -> None:
    grouped = [stage for _, stages in timeline.GROUPS for stage in stages]
    assert grouped == [stage for stage in protocol.STAGES if stage != protocol.DONE_STAGE]
    assert [group for group, _ in timeline.GROUPS] == [
        "boot",
        "stack",
        "fetch",
        "inputs",
        "pull",
        "setup",
        "run",
        "outputs",
        "artifacts",
    ]


def test_the_agent_opens_exactly_the_declared_stages() -> None:
    opened = agent_stages()
    undeclared = {name: where for name, where in opened.items() if name not in protocol.STAGES}
    assert not undeclared, f"the agent opens stages the protocol does not declare: {undeclared}"
    never = [name for name, _ in protocol.STAGE_GROUPS if name not in opened]
    assert not never, f"declared stages the agent never opens: {never}"
