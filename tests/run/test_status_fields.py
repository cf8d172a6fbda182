"""Every field of status.json the CLI reads is checked for type and range: a node (or a job that can
sign as it) writing a wrong type, a huge number, a nested value or null in any field gets exit 65
naming the field (the fields that decide: state, exit code, log counts) or the field dropped with a
note (those that only inform), never a crash (exit 70) and never an exit code outside 0..255.

The statuses are signed with the node's claimed key and read back through the file channel, the
path a real status takes (`Channel.read_status` -> `channel_trust.verified`), then fed to every
consumer the CLI has: observe, outcome, stale, vm_phases, the timeline, the GPU report, the log
reader and the artifacts check."""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from gpucloud.channel import trust
from gpucloud.channel.run_objects import FileChannel, node_prefix
from gpucloud.run import gpu_report
from gpucloud.run.watch import Observation, observe, outcome, stale, vm_phases
from gpucloud.ui.timeline import format_nodes
from gpucloud.vm import protocol

RUN = "fields-20260101-000000-abcd"
NOW = 1_800_000_000


def good_status(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "run_id": RUN,
        "rank": 0,
        "state": "failed",
        "stage": "done",
        "stages": {"run": {"start": NOW - 5, "end": NOW - 1, "ok": False}, "done": {"start": NOW, "end": None}},
        "heartbeat": NOW,
        "exit_code": 3,
        "message": "job exited with code 3",
        "log_parts": 0,
        "log_bytes": 0,
        "artifacts_sha256": "",
        "gpu": {"gpus": 1, "samples": 2, "mem_peak_mib": 10, "now": [[5, 10, 80, None, 40]], "series": {"points": []}},
        "inputs": {"files": 1, "of": 2, "bytes": 3, "of_bytes": 4},
    }
    doc.update(over)
    return doc


class SignedNode:
    """A file channel node whose manifest asks for signatures and whose key has claimed it."""

    def __init__(self, root: Path) -> None:
        self.channel = FileChannel(root)
        self.key = Ed25519PrivateKey.generate()
        pub = base64.b64encode(self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
        base = root / node_prefix(RUN, 0)
        (base / "log").mkdir(parents=True)
        (base / "manifest").write_text(f"run_id {RUN}\n{protocol.SIGN_LINE}\n")
        (base / "log" / protocol.claim_name(pub)).write_text(pub)
        self.status = base / "status.json"

    def write(self, doc: dict[str, Any]) -> None:
        raw = (json.dumps(doc, separators=(",", ":")) + "\n").encode()
        sig = base64.b64encode(self.key.sign(raw)).decode()
        self.status.write_bytes(protocol.signed_status(raw, sig))


BAD_VALUES: list[Any] = ["x", 10**400, -1, None, [1], {"a": 1}, True, 1e308, math.nan, -math.inf]
DECIDING = ("state", "exit_code", "log_parts", "log_bytes")
INFORMING = ("stage", "stages", "heartbeat", "message", "artifacts_sha256", "gpu", "inputs")
NESTED: list[tuple[str, Any]] = [  # (field, bad value inside a good shape)
    ("stages", {"run": {"start": "x", "end": 10**400}}),
    ("stages", {"run": {"start": 1, "end": math.nan, "ok": "yes"}}),
    ("stages", {"run": [1, 2]}),
    ("stages", {"::error::x\x1b]0;t\x07": {"start": 1, "end": 2}}),
    ("stages", {"done": {"start": {"a": 1}}}),
    ("gpu", {"now": [["x", "y", "z", "w", "v"]]}),
    ("gpu", {"now": [[1, 2]], "samples": 10**400}),
    ("gpu", {"series": {"points": [[1]]}}),
    ("gpu", {"series": {"points": [[1, None, 2]]}}),
    ("gpu", {"samples": math.inf, "mem_peak_mib": "big"}),
    ("gpu", {"a": {"b": {"c": {"d": {"e": 1}}}}}),
    ("inputs", {"files": "1", "of": 2, "bytes": 3, "of_bytes": 4}),
    ("inputs", {"files": 10**400}),
]
FINE = {("message", "x"), ("artifacts_sha256", "x"), ("gpu", "{'a': 1}"), ("inputs", "{'a': 1}")}  # right types
CASES = (
    [(field, value) for field in (*DECIDING, *INFORMING) for value in BAD_VALUES]
    + NESTED
    + [(field, "missing") for field in (*DECIDING, *INFORMING)]
)


def exercise(node: SignedNode, tmp_path: Path, statuses: list[dict | None]) -> tuple[str, int, str]:
    """Everything the CLI does with a node's statuses while it follows a run, shows one, or ends one."""
    obs = observe(node.channel, RUN, 1, ["gone"])
    assert obs.statuses == statuses or statuses == []
    _ = obs.finals, obs.preempted, obs.all_final, obs.stage(), obs.notes
    stale(obs.statuses, NOW, NOW + 100, 10)
    vm_phases(obs.statuses)
    format_nodes(obs.statuses, launched_at=NOW - 10, now=NOW)
    gpu_report.save(tmp_path, RUN, obs.statuses)
    nodes = gpu_report.load(tmp_path, RUN)
    summary = gpu_report.summarize(nodes)
    if summary:
        summary.setdefault("right_size", None)
        gpu_report.usage_lines(summary)
    gpu_report.node_lines(nodes)
    list(node.channel.iter_log(RUN, 0))
    trust.artifacts_problem(obs.statuses[0], "0" * 64, 0)
    return outcome(obs.statuses)


@pytest.mark.parametrize(("field", "value"), CASES, ids=[f"{f}={str(v)[:20]!r}" for f, v in CASES])
def test_a_bad_field_is_exit_65_or_dropped_never_a_crash(field: str, value: Any, tmp_path: Path) -> None:
    node = SignedNode(tmp_path / "store")
    doc = good_status()
    if value == "missing":
        doc.pop(field)
    else:
        doc[field] = value
    node.write(doc)
    read = node.channel.read_status(RUN, 0)
    assert read is not None
    status, code, message = exercise(node, tmp_path, [read])
    assert isinstance(code, int) and not isinstance(code, bool) and 0 <= code <= 255, (status, code)
    assert code != 70, (status, code, message)
    if read["state"] == "error" and read["exit_code"] == trust.REFUSED_EXIT:
        assert (status, code) == ("error", 65)
        assert f"`{field}`" in message, message
        assert field in DECIDING
    elif value not in ("missing", None) and field in INFORMING and (field, str(value)) not in FINE:  # null: absent
        assert (status, code) == ("failed", 3)
        assert any(f"`{field}`" in note for note in Observation([read], []).notes), read


@pytest.mark.parametrize("code", [256, -1, "0", 1e9, True, 2**64, None])
def test_exit_codes_outside_a_byte_never_become_success(code: Any, tmp_path: Path) -> None:
    """`failed` with exit code 256 used to leave the CLI as 256 % 256 = 0."""
    node = SignedNode(tmp_path / "store")
    node.write(good_status(exit_code=code))
    status, exit_code, message = outcome([node.channel.read_status(RUN, 0)])
    if code is None:  # a node that names no code for a failure: 1, as before
        assert (status, exit_code) == ("failed", 1)
    else:
        assert (status, exit_code) == ("error", 65) and "`exit_code`" in message, (status, exit_code, message)


def test_a_success_with_a_nonzero_code_is_refused(tmp_path: Path) -> None:
    node = SignedNode(tmp_path / "store")
    node.write(good_status(state="succeeded", exit_code=3, message=""))
    assert outcome([node.channel.read_status(RUN, 0)])[:2] == ("error", 65)
    node.write(good_status(state="succeeded", exit_code=0, message=""))
    assert outcome([node.channel.read_status(RUN, 0)])[:2] == ("succeeded", 0)


def test_outcome_keeps_exit_codes_in_a_byte_for_documents_it_did_not_check() -> None:
    """The last guard, for statuses that come from elsewhere (a provider's stand-in status)."""
    for code in (256, -1, "0", 1e9, True):
        assert outcome([{"state": "failed", "exit_code": code}])[:2] == ("error", 65)
    assert outcome([{"state": "failed", "exit_code": 0}])[:2] == ("failed", 1)
    assert outcome([{"state": "error", "exit_code": None}])[:2] == ("error", 70)
    assert outcome([{"state": "failed", "exit_code": 255}])[:2] == ("failed", 255)


def test_progress_statuses_are_checked_too(tmp_path: Path) -> None:
    """Unsigned progress statuses (anyone holding the grant can write them) are checked the same way."""
    node = SignedNode(tmp_path / "store")
    node.status.write_text(json.dumps({"state": "running", "stage": "\n::error::x", "log_parts": "9", "heartbeat": 1}))
    read = node.channel.read_status(RUN, 0)
    assert read is not None and read["state"] == "error" and "`log_parts`" in read["message"]
    node.status.write_text(json.dumps({"state": "running", "stage": "\n::error::x\x1b]0;t\x07", "heartbeat": "soon"}))
    read = node.channel.read_status(RUN, 0)
    assert read is not None and read["state"] == "running" and "stage" not in read and "heartbeat" not in read
    notes = Observation([read], []).notes
    assert len(notes) == 2 and all("\x1b" not in n and "\n" not in n for n in notes), notes
