"""End to end on the local provider: the real CLI in a subprocess, a real bootstrap, real processes.

Covers the "Done when" list of the local-run issue: quickstart with artifacts and logs, a failing job's
exit code, SIGINT/SIGTERM with nothing left running, max_duration, --detach with status / logs
--follow / down from other processes, env values byte for byte, two runs at once, `run --json`.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.support.cli import cli, start_cli
from tests.support.local_runs import find_vms, leftovers, run_id_of, status_json, write_job
from tests.support.procs import gpucloud_until_started
from tests.support.text import flat

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


def test_quickstart_succeeds_with_artifacts_and_log(tmp_path: Path, gpucloud_home: Path) -> None:
    proc = cli("run", str(REPO / "examples" / "quickstart.yaml"), "--cloud", "local", cwd=tmp_path, timeout=90)
    assert proc.returncode == 0, proc.stderr
    run_id = run_id_of(proc.stderr)
    assert "done: test accuracy" in proc.stdout
    out = tmp_path / "gpucloud-runs" / run_id
    assert (out / "outputs" / "model.json").stat().st_size > 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["test_accuracy"] > 0.9
    assert "done: test accuracy" in (gpucloud_home / "runs" / run_id / "log.txt").read_text()
    logs = cli("logs", run_id, cwd=tmp_path, check=True)
    assert "done: test accuracy" in logs.stdout
    doc = status_json(run_id, tmp_path)
    assert doc["status"] == "succeeded" and doc["exit_code"] == 0 and "run" in doc["phases"]
    assert all(r["status"] == "deleted" for r in doc["resources"])
    # One attempt, launched, ended by the teardown; this machine is free.
    assert [(a["cloud"], a["launched"], a["end_reason"], a["cost"]) for a in doc["attempts"]] == [
        ("local", True, "teardown", 0.0)
    ]
    assert leftovers(gpucloud_home, run_id) == []


def test_failing_job_exit_code_and_log_kept(tmp_path: Path, gpucloud_home: Path) -> None:
    job = write_job(tmp_path / "job", {"name": "fails", "run": "echo about to fail; echo oops >&2; exit 3"})
    proc = cli("run", str(job), "--cloud", "local", cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    run_id = run_id_of(proc.stderr)
    logs = cli("logs", run_id, cwd=tmp_path, check=True)
    assert "about to fail" in logs.stdout and "oops" in logs.stdout
    assert status_json(run_id, tmp_path)["status"] == "failed"


def test_run_json_document(tmp_path: Path, gpucloud_home: Path) -> None:
    job = write_job(tmp_path / "job", {"name": "jsonrun", "run": "echo hello-from-job", "artifacts": ["out.txt"]})
    (tmp_path / "job" / "out.txt").write_text("x")
    proc = cli("run", str(job), "--cloud", "local", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # stdout holds exactly one JSON document
    assert set(doc) == {"run_id", "status", "exit_code", "artifacts_dir", "artifacts_refused", "phases", "cost"}
    assert doc["status"] == "succeeded" and doc["exit_code"] == 0 and doc["cost"] == 0
    assert {"plan", "provision", "run", "teardown"} <= set(doc["phases"])
    assert Path(doc["artifacts_dir"], "out.txt").read_text() == "x"
    assert "hello-from-job" in proc.stderr and "hello-from-job" not in proc.stdout


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_tears_down_and_exits_130(tmp_path: Path, gpucloud_home: Path, sig: signal.Signals) -> None:
    token = f"gpucloud-test-sleeper-{sig.name}-{os.getpid()}"
    job = write_job(
        tmp_path / "job",
        {
            "name": "sleeper",
            "run": f"python -c 'import time; print(\"started\", flush=True); time.sleep(300)' {token}",
        },
    )
    proc = start_cli("run", str(job), "--cloud", "local", cwd=tmp_path)
    started = threading.Event()
    out: list[str] = []

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            if "started" in line:
                started.set()

    threading.Thread(target=reader, daemon=True).start()
    assert started.wait(30), "the job never printed its first line"
    assert leftovers(gpucloud_home, "", token), "the job should be running"
    proc.send_signal(sig)
    rc = proc.wait(30)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert rc == 130, stderr
    run_id = run_id_of(stderr)
    assert leftovers(gpucloud_home, run_id, token) == []
    doc = status_json(run_id, tmp_path)
    assert doc["status"] == "interrupted" and doc["exit_code"] == 130
    assert all(r["status"] == "deleted" for r in doc["resources"])


def test_second_ctrl_c_during_teardown_is_ignored(tmp_path: Path, gpucloud_home: Path) -> None:
    token = f"gpucloud-test-stubborn-{os.getpid()}"
    # The job ignores SIGTERM, so the teardown has to wait for its SIGKILL: time for a second Ctrl-C.
    job = write_job(
        tmp_path / "job",
        {
            "name": "stubborn",
            "run": f"python -c 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f'print("started", flush=True); time.sleep(300)\' {token}',
        },
    )
    proc = gpucloud_until_started(["run", str(job), "--cloud", "local"], tmp_path)
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(30)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert rc == 130, stderr
    assert "still tearing down" in flat(stderr)
    assert leftovers(gpucloud_home, run_id_of(stderr), token) == []


def test_max_duration_gives_124_and_nothing_left(tmp_path: Path, gpucloud_home: Path) -> None:
    token = f"gpucloud-test-overrun-{os.getpid()}"
    job = write_job(
        tmp_path / "job",
        {
            "name": "overrun",
            "max_duration": "3s",
            "run": f"echo started; python -c 'import time; time.sleep(300)' {token}",
        },
    )
    t0 = time.monotonic()
    proc = cli("run", str(job), "--cloud", "local", "--json", cwd=tmp_path, timeout=60)
    assert proc.returncode == 124, proc.stderr
    assert time.monotonic() - t0 < 30
    doc = json.loads(proc.stdout)
    assert doc["status"] == "deadline" and doc["exit_code"] == 124
    assert leftovers(gpucloud_home, doc["run_id"], token) == []
    logs = cli("logs", doc["run_id"], cwd=tmp_path, check=True)
    assert "started" in logs.stdout and "max_duration passed" in logs.stdout


def test_detach_then_status_logs_follow_and_down(tmp_path: Path, gpucloud_home: Path) -> None:
    job = write_job(
        tmp_path / "job",
        {
            "name": "detached",
            "run": "for i in 1 2 3 4 5; do echo line-$i; sleep 0.3; done; exit 4",
        },
    )
    proc = cli("run", str(job), "--cloud", "local", "--detach", cwd=tmp_path, check=True)
    run_id = proc.stdout.strip()
    assert run_id.startswith("detached-")
    doc = status_json(run_id, tmp_path)
    assert doc["status"] in ("running", "failed") and doc["detached"]
    follow = cli("logs", run_id, "--follow", cwd=tmp_path, timeout=60)
    assert follow.returncode == 4, follow.stderr
    assert [f"line-{i}" for i in range(1, 6)] == [ln for ln in follow.stdout.split() if ln.startswith("line-")]
    doc = status_json(run_id, tmp_path)
    assert doc["status"] == "failed" and doc["exit_code"] == 4
    listing = json.loads(cli("ls", "--json", cwd=tmp_path, check=True).stdout)
    assert [r["run_id"] for r in listing] == [run_id]

    # A long detached run, ended from yet another process.
    token = f"gpucloud-test-detached-sleeper-{os.getpid()}"
    long_job = write_job(
        tmp_path / "long", {"name": "longrun", "run": f"python -c 'import time; time.sleep(300)' {token}"}
    )
    run_id2 = cli("run", str(long_job), "--cloud", "local", "--detach", "--json", cwd=tmp_path, check=True)
    doc2 = json.loads(run_id2.stdout)
    assert doc2["status"] == "detached" and doc2["exit_code"] is None  # still running
    deadline = time.monotonic() + 20
    while not leftovers(gpucloud_home, doc2["run_id"], token) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers(gpucloud_home, doc2["run_id"], token)
    cli("down", doc2["run_id"], cwd=tmp_path, check=True)
    assert leftovers(gpucloud_home, doc2["run_id"], token) == []
    assert status_json(doc2["run_id"], tmp_path)["status"] == "down"


def test_env_values_reach_the_job_byte_for_byte(tmp_path: Path, gpucloud_home: Path) -> None:
    values = {
        "SUBST": "$(touch pwned-subst)",
        "BACKTICK": "`touch pwned-backtick`",
        "QUOTES": "it's \"quoted\" 'single' \\ back\\slash",
        "NEWLINES": "line one\nline two\n\ttabbed\n",
        "DOLLAR": "$HOME ${PATH} $1 $$ !! *",
        "UNICODE": "naïve ☃ 日本",
    }
    dump = f"import json, os\njson.dump({{k: os.environ.get(k) for k in {sorted(values)!r}}}, open('env.json', 'w'))\n"
    job = write_job(
        tmp_path / "job",
        {"name": "envjob", "env": values, "run": "python dump.py", "artifacts": ["env.json"]},
        files={"dump.py": dump},
    )
    proc = cli("run", str(job), "--cloud", "local", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_id = run_id_of(proc.stderr)
    seen = json.loads((tmp_path / "gpucloud-runs" / run_id / "env.json").read_text())
    assert seen == values
    assert not list(tmp_path.rglob("pwned-*")) and not list(gpucloud_home.rglob("pwned-*"))


def test_two_runs_at_once(tmp_path: Path, gpucloud_home: Path) -> None:
    job = write_job(tmp_path / "job", {"name": "twin", "run": "for i in 1 2 3; do echo tick $i; sleep 0.2; done"})
    procs = [start_cli("run", str(job), "--cloud", "local", "--json", cwd=tmp_path) for _ in range(2)]
    docs = []
    for p in procs:
        out, errout = p.communicate(timeout=90)
        assert p.returncode == 0, errout
        docs.append(json.loads(out))
    assert docs[0]["run_id"] != docs[1]["run_id"]
    listing = json.loads(cli("ls", "--json", cwd=tmp_path, check=True).stdout)
    assert {r["run_id"]: r["status"] for r in listing} == {d["run_id"]: "succeeded" for d in docs}
    human = cli("ls", cwd=tmp_path, check=True).stdout
    assert all(d["run_id"] in human for d in docs)


def test_down_from_another_process_stops_a_followed_run(tmp_path: Path, gpucloud_home: Path) -> None:
    token = f"gpucloud-test-followed-{os.getpid()}"
    job = write_job(
        tmp_path / "job", {"name": "followed", "run": f"echo go; python -c 'import time; time.sleep(300)' {token}"}
    )
    proc = start_cli("run", str(job), "--cloud", "local", cwd=tmp_path)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "go":
            break
    [run] = json.loads(cli("ls", "--json", cwd=tmp_path, check=True).stdout)
    assert run["status"] == "running" and not run["detached"]
    cli("down", run["run_id"], cwd=tmp_path, check=True)
    rc = proc.wait(30)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert rc == 130, stderr
    assert "gpucloud down" in flat(stderr)
    assert leftovers(gpucloud_home, run["run_id"], token) == []
    assert status_json(run["run_id"], tmp_path)["status"] == "down"


def test_dead_machine_is_reported_lost(tmp_path: Path, gpucloud_home: Path) -> None:
    job = write_job(tmp_path / "job", {"name": "doomed", "run": "echo go; sleep 300"})
    proc = start_cli("run", str(job), "--cloud", "local", cwd=tmp_path)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "go":
            break
    [vm] = find_vms(gpucloud_home / "local")
    for pid in vm.leftovers():  # the machine dies: no final status, no more heartbeats
        os.kill(pid, signal.SIGKILL)
    rc = proc.wait(40)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert rc == 70, stderr
    assert "without reporting a final status" in flat(stderr)
    run_id = run_id_of(stderr)
    assert status_json(run_id, tmp_path)["status"] == "lost"
    assert leftovers(gpucloud_home, run_id) == []


def test_artifacts_with_links_and_fifo_come_back_with_warnings(tmp_path: Path, gpucloud_home: Path) -> None:
    """One bad member does not lose every artifact; each refusal is named, and the run's summary says so."""
    job = write_job(
        tmp_path / "job",
        {
            "name": "arts",
            "artifacts": ["out/"],
            "run": "mkdir -p out/sub; for i in $(seq 1 50); do echo $i > out/sub/f$i; done; "
            "ln -s sub/f1 out/inside; ln -s /etc/hostname out/abs; ln -s ../../../x out/up; mkfifo out/pipe",
        },
    )
    proc = cli("run", str(job), "--cloud", "local", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "gpucloud-runs" / run_id_of(proc.stderr)
    assert len(list((out / "out" / "sub").iterdir())) == 50 and not (out / "out" / "inside").exists()
    assert not (out / "out" / "abs").exists() and not (out / "out" / "pipe").exists()
    for name, why in (
        ("out/inside", "a symbolic link (to 'sub/f1')"),
        ("out/abs", "a symbolic link (to '/etc/hostname')"),
        ("out/up", "a symbolic link (to '../../../x')"),
        ("out/pipe", "a FIFO"),
    ):
        assert f"artifact '{name}' not extracted: {why}" in proc.stderr, proc.stderr
    assert "50 file(s), 4 refused" in proc.stderr
    assert "succeeded (exit 0): 4 artifact member(s) refused" in proc.stderr
    assert "none of its artifacts" not in proc.stderr


def test_a_job_that_kills_the_watchdog_is_still_stopped(tmp_path: Path, gpucloud_home: Path) -> None:
    """Layer (a): with the watchdog gone, the backstop (max_duration + 30 s grace) ends the VM and
    reports `deadline`; nothing is left running."""
    token = f"gpucloud-test-nowatchdog-{os.getpid()}"
    job = write_job(
        tmp_path / "job",
        {
            "name": "nowd",
            "max_duration": "2s",
            "run": f"kill -9 $(cat ../st/wd_pid); echo killed; python -c 'import time; time.sleep(300)' {token}",
        },
    )
    t0 = time.monotonic()
    proc = cli("run", str(job), "--cloud", "local", "--json", cwd=tmp_path, timeout=120)
    took = time.monotonic() - t0
    doc = json.loads(proc.stdout)
    assert leftovers(gpucloud_home, doc["run_id"], token) == []
    assert took < 2 + 30 + 15, took
    assert proc.returncode == 124 and doc["status"] == "deadline", (doc, proc.stderr[-2000:])


SAVES_ON_TERM = """import os, signal, sys, time
def save(*_):
    os.makedirs("out", exist_ok=True)
    open("out/model.txt", "w").write("saved on SIGTERM\\n")
    print("saved", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
print("started", flush=True)
while True:
    time.sleep(0.1)
"""


@pytest.mark.parametrize("saves", [True, False])
def test_ctrl_c_brings_back_what_the_job_saved_and_the_log_agrees(
    tmp_path: Path, gpucloud_home: Path, saves: bool
) -> None:
    run = "python train.py" if saves else "python -c 'import time; print(\"started\", flush=True); time.sleep(300)'"
    job = write_job(tmp_path / "job", {"name": "saver", "run": run, "artifacts": ["out/"]}, {"train.py": SAVES_ON_TERM})
    proc = gpucloud_until_started(["run", str(job)], tmp_path, env={**os.environ, "COLUMNS": "80"})
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(60)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert rc == 130, stderr
    run_id = run_id_of(stderr)
    dest = tmp_path / "gpucloud-runs" / run_id
    if saves:
        assert (dest / "out" / "model.txt").read_text() == "saved on SIGTERM\n"
        assert f"artifacts in {dest}: 1 file(s)" in flat(stderr), stderr
    else:
        assert not dest.exists() and "nothing came back" in flat(stderr), stderr
    doc = status_json(run_id, tmp_path)
    assert doc["status"] == "interrupted" and doc["exit_code"] == 130
    log = cli("logs", run_id, cwd=tmp_path, check=True).stdout.splitlines()
    assert log[-1] == f"[gpucloud] run {run_id} interrupted (exit 130): SIGINT received", log[-4:]
    assert ("saved" in log) == saves and "exit code null" not in log[-1]
