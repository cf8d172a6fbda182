"""Kept machines on the local provider, through the real CLI: `keep:` leaves the machine up after its
job, `exec` and `run --on` run the next job on it (changed files only, its own exit code, artifacts
and attempt), a request nobody signed with the run's owner key is not run, the machine ends by its
idle time and, with a session open that never ends, by max_duration; nothing is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpucloud.channel import owner
from gpucloud.run import keep
from gpucloud.vm.agent import job_request
from tests.support.cli import cli
from tests.support.local_runs import find_vms, leftovers, run_id_of, status_json, write_job
from tests.support.polling import wait_until
from tests.support.text import flat

pytestmark = pytest.mark.slow


def _kept_run(tmp_path: Path, doc: dict, files: dict[str, str] | None = None) -> str:
    job = write_job(tmp_path / "job", {"name": "kept", **doc}, files)
    proc = cli("run", str(job), cwd=tmp_path, timeout=90)
    assert proc.returncode == 0, proc.stderr
    run_id = run_id_of(proc.stderr)
    assert "the machine is kept for" in proc.stderr
    return run_id


def _wait_status(run_id: str, cwd: Path, want: set[str], timeout: float) -> dict:
    end = time.monotonic() + timeout
    doc: dict = {}
    while time.monotonic() < end:
        doc = status_json(run_id, cwd)
        if doc["status"] in want:
            return doc
        time.sleep(0.5)
    raise AssertionError(f"run {run_id} still {doc.get('status')} after {timeout}s")


def _torn_down(run_id: str, cwd: Path) -> bool:
    doc = json.loads(cli("status", run_id, "--json", cwd=cwd, check=True).stdout)
    by_follower = any("torn down" in e["message"] and "nothing left" in e["message"] for e in doc["events"])
    return by_follower and bool(doc["resources"]) and all(r["status"] == "deleted" for r in doc["resources"])


def _sandbox(home: Path, run_id: str) -> Path:
    (vm,) = find_vms(home / "local" / run_id)
    return vm.sandbox


def test_kept_run_takes_exec_and_run_on_then_ends_idle(tmp_path: Path, gpucloud_home: Path) -> None:
    run_id = _kept_run(
        tmp_path,
        {"keep": "12s", "run": "cat data.txt", "env": {"GREETING": "hi"}},
        {"data.txt": "v1\n", "big.txt": "x" * 1000},
    )
    doc = status_json(run_id, tmp_path)
    assert doc["status"] == "kept" and doc["exit_code"] == 0
    listed = cli("ls", cwd=tmp_path, check=True, env={**os.environ, "COLUMNS": "200"}).stdout
    assert "kept" in listed and "idle, $0.000/h" in listed
    # exec: only the changed file goes; the run's env; the job's own exit code.
    (tmp_path / "job" / "data.txt").write_text("v2\n")
    proc = cli("exec", run_id, "--", 'cat data.txt; echo "$GREETING"; exit 3', cwd=tmp_path, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "v2\nhi\n" in proc.stdout and "v1" not in proc.stdout  # the first job's log is not repeated
    assert "1 changed file(s), 0 removed" in proc.stderr
    # run --on: the job file's commands and artifacts, a file removed on this side goes there too.
    (tmp_path / "job" / "big.txt").unlink()
    job = write_job(
        tmp_path / "job",
        {"name": "kept", "keep": "12s", "run": "ls; cat data.txt > out.txt", "artifacts": ["out.txt"]},
    )
    proc = cli("run", "--on", run_id, str(job), cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "big.txt" not in proc.stdout and "data.txt" in proc.stdout
    assert (tmp_path / "gpucloud-runs" / run_id / "job-2" / "out.txt").read_text() == "v2\n"
    doc = status_json(run_id, tmp_path)
    assert [a["end_reason"] for a in doc["attempts"]][:2] == ["kept: job 1 started", "kept: job 2 started"]
    assert len(doc["attempts"]) == 3
    # Idle for `keep`: the node ends itself as a run does; `down` then finds nothing running.
    doc = _wait_status(run_id, tmp_path, {"succeeded", "failed"}, timeout=40)
    assert doc["status"] == "succeeded"
    assert leftovers(gpucloud_home, run_id) == []
    log = cli("logs", run_id, cwd=tmp_path, check=True).stdout
    assert "the kept machine was idle for 12s: it ends" in log
    # Nobody ran `down` or `gc`: the run's follower tore down what it held, and is gone itself.
    assert wait_until(lambda: _torn_down(run_id, tmp_path), timeout=20), status_json(run_id, tmp_path)
    assert wait_until(lambda: keep.follower_pid(run_id) is None, timeout=10)
    down = cli("down", run_id, "--yes", cwd=tmp_path, check=True)
    assert "nothing left to tear down" in flat(down.stderr)


def test_exec_refuses_a_run_that_is_not_kept_and_a_job_for_other_machines(tmp_path: Path, gpucloud_home: Path) -> None:
    job = write_job(tmp_path / "plain", {"name": "plain", "run": "true"})
    plain = run_id_of(cli("run", str(job), cwd=tmp_path, check=True).stderr)
    proc = cli("exec", plain, "--", "true", cwd=tmp_path)
    assert proc.returncode == 2 and "only a kept run takes another job" in flat(proc.stderr)
    run_id = _kept_run(tmp_path, {"keep": "20s", "run": "true"})
    other = write_job(tmp_path / "other", {"name": "kept", "run": "true", "max_duration": "20m"})
    proc = cli("run", "--on", run_id, str(other), cwd=tmp_path)
    assert proc.returncode == 2 and "max_duration differ" in flat(proc.stderr)
    bad = cli("run", str(job), "--keep", "3s", cwd=tmp_path)
    assert bad.returncode == 2 and "--keep:" in bad.stderr
    cli("down", run_id, "--yes", cwd=tmp_path, check=True)
    assert leftovers(gpucloud_home, run_id) == []


def test_a_request_not_signed_by_the_owner_key_is_not_run(tmp_path: Path, gpucloud_home: Path) -> None:
    run_id = _kept_run(tmp_path, {"keep": "20s", "run": "true"})
    marker = tmp_path / "planted"
    # Anyone who can write the run's channel: a request signed with a key of their own.
    stranger = "stranger-" + run_id
    owner.owner_public(stranger)
    body = job_request.request_body(
        {"run_id": run_id, "rank": 0, "seq": 99, "run": f"touch {marker}", "env": {}, "delete": [], "artifacts": []}
    )
    channel = gpucloud_home / "channel" / "runs" / run_id / "node-0"  # the local provider's FileChannel
    (channel / "request").write_bytes(job_request.signed_request(body, owner.owner_sign(stranger, body)))
    job_log = _sandbox(gpucloud_home, run_id) / "job.log"
    refused = "was refused: not signed by the run's owner key"
    assert wait_until(lambda: refused in job_log.read_text(), timeout=60), job_log.read_text()  # the node read it
    assert not marker.exists()
    proc = cli("exec", run_id, "--", "echo taken", cwd=tmp_path, timeout=60)  # the owner's own still runs
    assert proc.returncode == 0 and "taken" in proc.stdout, proc.stderr
    cli("down", run_id, "--yes", cwd=tmp_path, check=True)
    assert leftovers(gpucloud_home, run_id) == []


def test_a_hung_session_keeps_the_machine_only_until_max_duration(tmp_path: Path, gpucloud_home: Path) -> None:
    run_id = _kept_run(tmp_path, {"keep": "10m", "max_duration": "12s", "run": "true"})
    sessions = _sandbox(gpucloud_home, run_id) / "sessions"
    sessions.mkdir()
    hung = subprocess.Popen(["sleep", "600"])
    try:
        (sessions / "hung").write_text(f"{hung.pid}\n")
        doc = _wait_status(run_id, tmp_path, {"deadline", "succeeded", "failed"}, timeout=60)
        assert doc["status"] == "deadline", doc
        assert leftovers(gpucloud_home, run_id) == []
    finally:
        hung.kill()
        hung.wait()
    cli("down", run_id, "--yes", cwd=tmp_path, check=True)
    doc = json.loads(cli("status", run_id, "--json", cwd=tmp_path, check=True).stdout)
    assert all(r["status"] == "deleted" for r in doc["resources"])


def test_the_next_job_shows_its_first_line_within_5s(tmp_path: Path, gpucloud_home: Path) -> None:
    from tests.support.keep_timing import FIRST_LINE_BUDGET_S, record, timed_first_line

    job = write_job(tmp_path / "job", {"name": "kept", "keep": "60s", "run": "echo first-line-cold"})
    cold_s, proc = timed_first_line(["run", str(job)], env=os.environ, cwd=tmp_path, marker="first-line-cold")
    assert proc.returncode == 0, proc.stderr
    run_id = run_id_of(proc.stderr)
    job = write_job(tmp_path / "job", {"name": "kept", "keep": "60s", "run": "echo first-line-kept"})
    kept_s, proc = timed_first_line(
        ["run", "--on", run_id, str(job)], env=os.environ, cwd=tmp_path, marker="first-line-kept"
    )
    assert proc.returncode == 0, proc.stderr
    record("local", cold_s, kept_s)
    assert kept_s <= FIRST_LINE_BUDGET_S, (kept_s, cold_s)
    cli("down", run_id, "--yes", cwd=tmp_path, check=True)
    assert leftovers(gpucloud_home, run_id) == []


def test_a_detached_kept_run_is_recorded_kept_not_ended(tmp_path: Path, gpucloud_home: Path) -> None:
    job = write_job(tmp_path / "job", {"name": "kept", "keep": "60s", "run": "true"})
    run_id = run_id_of(cli("run", str(job), "--detach", cwd=tmp_path, check=True).stderr)
    doc = _wait_status(run_id, tmp_path, {"kept", "succeeded"}, timeout=60)
    assert doc["status"] == "kept"  # not "succeeded" while its machine waits (gc would tear it down)
    # Its follower was started at `run --detach`; one that died is started again by the next `ls`.
    first = keep.follower_pid(run_id)
    assert first is not None
    os.kill(first, signal.SIGKILL)
    assert wait_until(lambda: keep.follower_pid(run_id) is None, timeout=10)
    cli("ls", cwd=tmp_path, check=True)
    assert keep.follower_pid(run_id) not in (None, first)
    cli("gc", "--yes", "--cloud", "local", cwd=tmp_path, check=True)
    proc = cli("exec", run_id, "--", "echo still-here", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0 and "still-here" in proc.stdout, proc.stderr
    cli("down", run_id, "--yes", cwd=tmp_path, check=True)
    assert leftovers(gpucloud_home, run_id) == []


def test_an_open_ssh_session_holds_a_kept_machine_past_its_idle_time(tmp_path: Path, gpucloud_home: Path) -> None:
    """`gpucloud ssh` registers its shell in the node's sessions/ (the pid `exec` keeps), so the idle
    clock does not end a machine someone is working on; once the session closes, it ends idle."""
    run_id = _kept_run(tmp_path, {"keep": "10s", "run": "true"})
    release = tmp_path / "release"
    env = {**os.environ, "COLUMNS": "200"}
    wait = f"while [ ! -e {release} ]; do sleep 0.2; done"
    session = subprocess.Popen(
        ["gpucloud", "ssh", run_id, "--", wait], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        sessions = _sandbox(gpucloud_home, run_id) / "sessions"
        end = time.monotonic() + 30
        while time.monotonic() < end and not any(sessions.glob("ssh-*")):
            time.sleep(0.2)
        (mark,) = sessions.glob("ssh-*")
        assert mark.read_text().strip() == mark.name.removeprefix("ssh-")  # the shell's own pid
        time.sleep(16)  # past the 10 s idle time
        assert status_json(run_id, tmp_path)["status"] == "kept"
        release.touch()
        assert session.wait(timeout=30) == 0
        doc = _wait_status(run_id, tmp_path, {"succeeded", "failed", "deadline"}, timeout=60)
        assert doc["status"] == "succeeded", doc
        assert leftovers(gpucloud_home, run_id) == []
    finally:
        release.touch()
        if session.poll() is None:
            session.kill()
        session.communicate()


def test_run_on_takes_the_new_jobs_own_secrets_and_inputs(tmp_path: Path, gpucloud_home: Path) -> None:
    """`run --on` seals the job file's own secrets and input grants to the kept node (the request
    names the sealed object's SHA-256); the first job's secret is gone, the new one is masked."""
    import secrets as token

    first, second = f"first-{token.token_hex(8)}", f"second-{token.token_hex(8)}"
    job = write_job(tmp_path / "job", {"name": "kept", "keep": "20s", "secrets": ["TOKEN_A"], "run": "true"})
    proc = cli("run", str(job), "--secret", f"TOKEN_A={first}", cwd=tmp_path, timeout=90)
    assert proc.returncode == 0, proc.stderr
    run_id = run_id_of(proc.stderr)
    (tmp_path / "job" / "in2").mkdir()
    (tmp_path / "job" / "in2" / "x.txt").write_text("input-two\n")
    job = write_job(
        tmp_path / "job",
        {
            "name": "kept",
            "keep": "20s",
            "secrets": ["TOKEN_B"],
            "inputs": {"d/": "./in2"},
            "run": 'echo "a-len=${#TOKEN_A} b=$TOKEN_B b-len=${#TOKEN_B}"; cat d/x.txt',
        },
    )
    proc = cli("run", "--on", run_id, str(job), "--secret", f"TOKEN_B={second}", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"a-len=0 b=*** b-len={len(second)}" in proc.stdout and "input-two" in proc.stdout, proc.stdout
    assert second not in proc.stdout + proc.stderr and first not in proc.stdout + proc.stderr
    sealed_obj = gpucloud_home / "channel" / "runs" / run_id / "exec" / "1.sealed"
    assert sealed_obj.is_file() and second.encode() not in sealed_obj.read_bytes()
    cli("down", run_id, "--yes", cwd=tmp_path, check=True)
    assert leftovers(gpucloud_home, run_id) == []
