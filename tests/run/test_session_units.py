"""The pieces of `gpucloud ssh` that need no machine: the job file's `ports` (each problem one line
naming file, line and field), `-L` forwards (loopback only), the forwards a session asks for (the
job's ports after -L, a taken port moved), a run that cannot have a session, and the contract's
default for a provider without a session path."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from gpucloud.contract.provider import Capabilities, Provider, RunHandle
from gpucloud.contract.session import Forward, SessionAsk
from gpucloud.errors import SessionUnsupported, UserError
from gpucloud.run.session import SessionRequest, forwards_for, parse_forward, session_target
from gpucloud.spec.load import parse_spec
from gpucloud.spec.values import SpecError
from gpucloud.state.records import AttemptRecord, RunRecord

JOB = "name: p\nresources: {cloud: local}\nrun: echo hi\n"


@pytest.mark.parametrize(
    "ports,where,says",
    [
        ("[6006, 8888,\n  yes]", "job.yaml:5: ports[2]", "true (a boolean) is not a port"),
        ("[6006, 6006]", "job.yaml:4: ports", "port 6006 is listed twice"),
        ("[70000]", "job.yaml:4: ports[0]", "the number 70000 is not a port"),
        ("['8888']", "job.yaml:4: ports[0]", "is not a port"),
        (str(list(range(1, 18))), "job.yaml:4: ports", "17 ports; at most 16"),
    ],
)
def test_bad_ports_name_the_file_line_and_field(ports: str, where: str, says: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(JOB + f"ports: {ports}\n", "job.yaml")
    assert err.value.exit_code == 2
    text = " ".join(err.value.message.split())
    assert text.startswith(where) and says in text, text


def test_ports_are_kept_in_the_spec() -> None:
    spec = parse_spec(JOB + "ports: [6006, 8888]\n", "job.yaml")
    assert spec.ports == [6006, 8888]
    assert json.loads(spec.model_dump_json())["ports"] == [6006, 8888]


@pytest.mark.parametrize("text,local,remote", [("8888", 8888, 8888), ("9000:8888", 9000, 8888)])
def test_a_forward_is_a_port_or_local_colon_port(text: str, local: int, remote: int) -> None:
    assert parse_forward(text) == Forward(local=local, remote=remote)


@pytest.mark.parametrize("text", ["0.0.0.0:8888:8888", "*:8888", "localhost:8888", "0", "70000", "8888:", "-1"])
def test_a_forward_that_could_listen_beyond_loopback_or_is_no_port_is_refused(text: str) -> None:
    with pytest.raises(UserError, match="is not a port forward"):
        parse_forward(text)


def run_record(**changes: object) -> RunRecord:
    handle = RunHandle(run_id="p-20260101-000000-abcd", cloud="local", region="local", nodes=["pid:1"])
    attempt = AttemptRecord(
        run_id=handle.run_id,
        idx=1,
        cloud="local",
        region="local",
        zone=None,
        instance_type="localhost",
        spot=False,
        price_per_hour=0.0,
        num_nodes=1,
        started_at=0.0,
        ended_at=None,
        end_reason=None,
        launched=True,
        handle_json=handle.to_json(),
    )
    base = RunRecord(
        id=handle.run_id,
        name="p",
        spec_path=None,
        spec_json=json.dumps({"ports": [6006, 8888]}),
        cloud="local",
        region="local",
        instance_type="localhost",
        num_nodes=1,
        price_per_hour=0.0,
        status="running",
        phase="run",
        exit_code=None,
        message=None,
        created_at=0.0,
        started_at=0.0,
        ended_at=None,
        deadline=None,
        artifacts_dir=None,
        detached=True,
        pid=None,
        attempts=[attempt],
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_the_jobs_ports_follow_the_forwards_asked_for_and_a_taken_port_moves() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        run = run_record(spec_json=json.dumps({"ports": [8888, busy]}))
        got = forwards_for(SessionRequest(run_ref=run.id, forwards=("9000:8888",)), run)
    assert got[0] == Forward(local=9000, remote=8888)  # -L wins over the job's own 8888
    assert len(got) == 2 and got[1].remote == busy and got[1].local != busy


def test_a_run_that_ended_or_has_no_machine_or_node_has_no_session() -> None:
    with pytest.raises(UserError, match="is down: its machines are gone"):
        session_target(None, run_record(status="down"), 0)
    with pytest.raises(UserError, match="has no machine yet"):
        session_target(None, run_record(status="provisioning", attempts=[]), 0)
    with pytest.raises(UserError, match=r"has node\(s\) 0..0"):
        session_target(None, run_record(), 1)
    assert session_target(None, run_record(), 0).nodes == ["pid:1"]


def test_a_provider_without_a_session_path_says_so_with_exit_78() -> None:
    class Bare(Provider):
        name = "bare"
        capabilities = Capabilities()

    with pytest.raises(SessionUnsupported) as err:
        Bare().session_path(RunHandle(run_id="r", cloud="bare", region="x"), 0, SessionAsk())
    assert err.value.exit_code == 78 and "bare provider has no session path" in err.value.message


def test_a_term_right_after_the_url_lines_ends_gpucloud_with_143_and_starts_no_session(tmp_path: Path) -> None:
    """The lines a caller acts on come after the handlers: a TERM then is gpucloud's 143, not a
    default death that would leave a session (and its forwards) behind."""
    import os
    import signal

    from gpucloud.contract.session import SessionPlan
    from gpucloud.run.session import run_plan

    started = tmp_path / "started"
    plan = SessionPlan(argv=["touch", str(started)])
    before = signal.getsignal(signal.SIGTERM)
    assert run_plan(plan, announce=lambda: os.kill(os.getpid(), signal.SIGTERM)) == 143
    assert not started.exists()
    assert signal.getsignal(signal.SIGTERM) is before  # the process's own handler is back
