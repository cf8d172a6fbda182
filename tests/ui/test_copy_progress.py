"""The input copy's progress travels in the node's status document and shows beside its timeline line
while the `inputs` stage is open; once the stage ends only the stage's time is left."""

from __future__ import annotations

import json
from pathlib import Path

from gpucloud.ui.timeline import copy_progress, format_timeline
from gpucloud.vm.agent.status import StatusBoard


def test_progress_rides_on_the_status_document_while_inputs_run(tmp_path: Path) -> None:
    now = [1000.0]
    board = StatusBoard("r1", 0, tmp_path, lambda: now[0], lambda path, final: True)
    board.begin_stage("inputs", 1000.0)
    board.set(inputs={"files": 412, "of": 2000, "bytes": 61_800_000, "of_bytes": 300_000_000})
    now[0] = 1012.0
    doc = json.loads(board.document())
    assert doc["inputs"] == {"files": 412, "of": 2000, "bytes": 61_800_000, "of_bytes": 300_000_000}
    assert copy_progress(doc) == " (inputs 412/2000 files, 61.8/300.0 MB)"
    board.end_stage("inputs", True)
    board.begin_stage("setup", 1012.0)
    doc = json.loads(board.document())
    assert copy_progress(doc) == ""
    assert "inputs 12s" in format_timeline(doc["stages"], launched_at=None, now=1013.0)


def test_a_document_without_progress_has_no_inputs_field(tmp_path: Path) -> None:
    board = StatusBoard("r1", 0, tmp_path, lambda: 5.0, lambda path, final: True)
    board.begin_stage("run", 1.0)
    assert "inputs" not in json.loads(board.document())
