"""A provider that installs no stack (this machine, your hosts) uses the machine's own GPU: the
planner says so as a note, not a warning, so `run`'s plan line (which says it itself) needs no
filter on the warnings' text, and `plan` prints it as a note."""

from __future__ import annotations

import pytest

from gpucloud.plan.planner import make_plan
from gpucloud.spec.load import parse_spec
from gpucloud.ui import views


def test_the_machines_own_gpu_is_a_note_not_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    spec = parse_spec("name: q\nresources: {cloud: local, gpu: 'T4:1'}\nrun: x\n", "job.yaml")
    plan = make_plan(spec)
    assert not [w for w in plan.warnings if "stack install is skipped" in w], plan.warnings
    assert [n for n in plan.notes if "stack install is skipped" in n], plan.notes
    assert plan.as_json()["notes"] == plan.notes
    views.print_plan_summary(plan)
    said = capsys.readouterr().err
    assert said.startswith("plan: local/") and "warning" not in said, said
    views.print_plan(plan)
    said = capsys.readouterr()
    assert "note: local provider: the stack install is skipped" in " ".join((said.out + said.err).split())
    assert "warning: local provider" not in said.out + said.err


def test_every_priced_row_says_how_old_its_price_is(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan and catalog tables' source column carries each row's age in days, not only a warning."""
    monkeypatch.setenv("COLUMNS", "200")  # wide enough for the optional source column
    import re

    from gpucloud.contract.provider import PriceSource
    from gpucloud.ui.plan_notes import source_cell

    assert source_cell(PriceSource("shipped", "2026-08-26")).startswith("shipped 2026-08-26 ")
    assert re.fullmatch(r"ESTIMATE \d+d", source_cell(PriceSource("estimate", "2024")))
    assert source_cell(None) == "-"
    spec = parse_spec("name: q\nresources: {cloud: aws, gpu: 'T4:1'}\nrun: x\n", "job.yaml")
    views.print_plan(make_plan(spec))
    rows = [line for line in capsys.readouterr().out.splitlines() if re.match(r"^\d+ +aws ", line)]
    assert rows and all(re.search(r"(shipped|live|ESTIMATE|OLD)\b.* \d+d$", row) for row in rows), rows
