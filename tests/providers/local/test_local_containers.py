"""`container:` end to end on the local provider: the real CLI, a real podman and real registries
(tests/support/containers.py). The job runs in a busybox image pulled from a registry on 127.0.0.1;
it reads its input, sees the node's variables and its secret (masked in the log), writes an
artifact and a checkpoint and ends with its own code; a private image needs its login; a missing
image fails in container_pull; a deadline, a job ignoring SIGTERM and two nodes leave no container.
"""

from __future__ import annotations

import hashlib
import json
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.support.cli import cli
from tests.support.container_jobs import RENDEZVOUS, SECRET, containers_of, count_job, main_job
from tests.support.containers import ContainerLab, container_lab, podman  # noqa: F401
from tests.support.local_runs import leftovers, run_id_of, status_json, write_job
from tests.support.procs import gpucloud_until_started
from tests.support.spot_job import check_finished_count, preempted_twice

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("code", [3, 0])
def test_job_runs_in_the_image_with_inputs_env_secret_artifacts_and_its_exit_code(
    tmp_path: Path, gpucloud_home: Path, container_lab: ContainerLab, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    monkeypatch.setenv("BOX_TOKEN", SECRET)
    job = main_job(tmp_path / "job", container_lab.image, code)
    proc = cli("run", str(job), "--cloud", "local", cwd=tmp_path, timeout=180)
    assert proc.returncode == code, proc.stdout + proc.stderr
    run_id = run_id_of(proc.stderr)
    log = (gpucloud_home / "runs" / run_id / "log.txt").read_text()
    assert "stage container_pull" in log and f"pulled {container_lab.image}" in log, log
    assert "steps run with sh" in log  # busybox has no bash
    assert "setup-in-image=yes" in log and "input-line-42" in log
    assert f"in-image pwd={gpucloud_home / 'local' / run_id / 'node-0' / 'job'}" in log
    assert f"run={run_id} rank=0 nodes=1 epochs=2 path=/bin\n" in log  # the image's PATH, not the host's
    assert "token=***" in log and SECRET not in log
    assert hashlib.sha256(SECRET.encode()).hexdigest() in log
    assert "notice-dir-mounted" in log and "checkpoint 1 uploaded (end" in log
    result = tmp_path / "gpucloud-runs" / run_id / "out" / "result.txt"
    assert result.read_text() == f"result of {run_id}\n"
    doc = status_json(run_id, tmp_path)
    assert doc["status"] == ("succeeded" if code == 0 else "failed") and doc["exit_code"] == code
    assert "container_pull" in doc["phases"] or any("container_pull" in k for k in doc["phases"]), doc["phases"]
    assert containers_of(run_id) == [] and leftovers(gpucloud_home, run_id) == []


def test_private_image_needs_its_login(
    tmp_path: Path, gpucloud_home: Path, container_lab: ContainerLab, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg = container_lab.auth_registry
    doc = {
        "name": "private",
        "container": {
            "image": container_lab.private_image,
            "login": {"username": reg.username, "password_secret": "REG_PASS"},
            "pull": "always",  # each run pulls, so each logs in (missing: the first run's copy would do)
        },
        "secrets": ["REG_PASS"],
        "run": "echo private-ok",
    }
    job = write_job(tmp_path / "job", doc)
    monkeypatch.setenv("REG_PASS", reg.password)
    proc = cli("run", str(job), "--cloud", "local", cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = run_id_of(proc.stderr)
    log = (gpucloud_home / "runs" / run_id / "log.txt").read_text()
    assert f"logged in to {reg.host} as {reg.username}" in log and "private-ok" in log
    assert reg.password not in log
    assert not list((gpucloud_home / "local" / run_id).rglob("auth.json")), "the login's credentials stay"
    monkeypatch.setenv("REG_PASS", "not-the-password")
    proc = cli("run", str(job), "--cloud", "local", "--json", cwd=tmp_path, timeout=180)
    assert proc.returncode != 0
    doc_out = json.loads(proc.stdout)
    status = status_json(doc_out["run_id"], tmp_path)
    assert status["status"] == "error", status
    message = " ".join(proc.stderr.split())
    assert f"container: login to {reg.host} as {reg.username} failed" in message, message
    assert "check the username and the value of REG_PASS" in message
    assert containers_of(doc_out["run_id"]) == []


def test_missing_image_fails_in_container_pull_quickly(
    tmp_path: Path, gpucloud_home: Path, container_lab: ContainerLab
) -> None:
    image = container_lab.open_registry.ref("team/missing", "9.9")
    job = write_job(tmp_path / "job", {"name": "noimage", "container": image, "run": "echo never"})
    t0 = time.monotonic()
    proc = cli("run", str(job), "--cloud", "local", "--json", cwd=tmp_path, timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode != 0 and took < 60, (took, proc.stderr)
    run_id = json.loads(proc.stdout)["run_id"]
    message = " ".join(proc.stderr.split())
    assert f"container: cannot pull {image}:" in message and "manifest unknown" in message, message
    log = (gpucloud_home / "runs" / run_id / "log.txt").read_text()
    assert "pull 3/3" in log and "never" not in log.replace("echo never", "")
    channel_status = json.loads(next((gpucloud_home / "channel" / "runs" / run_id).rglob("status.json")).read_text())
    assert channel_status["state"] == "error" and channel_status["stages"]["container_pull"]["ok"] is False
    assert channel_status["message"].startswith(f"container: cannot pull {image}: ")


def test_deadline_ends_the_containerised_job_and_removes_it(
    tmp_path: Path, gpucloud_home: Path, container_lab: ContainerLab
) -> None:
    job = write_job(
        tmp_path / "job",
        {
            "name": "boxdeadline",
            "max_duration": "8s",
            "container": container_lab.image,
            "run": "echo started; sleep 300",
        },
    )
    t0 = time.monotonic()
    proc = cli("run", str(job), "--cloud", "local", "--json", cwd=tmp_path, timeout=120)
    assert proc.returncode == 124, proc.stderr
    assert time.monotonic() - t0 < 60
    run_id = json.loads(proc.stdout)["run_id"]
    assert status_json(run_id, tmp_path)["status"] == "deadline"
    logs = cli("logs", run_id, cwd=tmp_path, check=True).stdout
    assert "started" in logs and "max_duration passed" in logs
    assert containers_of(run_id) == [] and leftovers(gpucloud_home, run_id) == []


def test_job_ignoring_sigterm_is_killed_and_removed_on_ctrl_c(
    tmp_path: Path, gpucloud_home: Path, container_lab: ContainerLab
) -> None:
    job = write_job(
        tmp_path / "job",
        {
            "name": "boxstubborn",
            "container": container_lab.image,
            "run": "trap '' TERM; echo started; while true; do sleep 1; done",
        },
    )
    proc = gpucloud_until_started(["run", str(job), "--cloud", "local"], tmp_path)
    run_id = next(d.name for d in (gpucloud_home / "local").iterdir() if d.name.startswith("boxstubborn"))
    assert containers_of(run_id) == [f"gpucloud-{run_id}-0-run"]
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(60)
    stderr = proc.stderr.read() if proc.stderr else ""
    assert rc == 130, stderr
    log = (gpucloud_home / "runs" / run_id / "log.txt").read_text()
    assert "job ignored SIGTERM for 5 s: SIGKILL" in log, log[-2000:]
    assert containers_of(run_id) == [] and leftovers(gpucloud_home, run_id) == []


def test_two_nodes_rendezvous_over_the_hosts_network(
    tmp_path: Path, gpucloud_home: Path, container_lab: ContainerLab
) -> None:
    job = write_job(
        tmp_path / "job",
        {"name": "boxpair", "num_nodes": 2, "container": container_lab.image, "run": RENDEZVOUS},
    )
    proc = cli("run", str(job), "--cloud", "local", cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_id = run_id_of(proc.stderr)
    log = (gpucloud_home / "runs" / run_id / "log.txt").read_text()
    assert "rank0 got: hello from rank 1" in log, log[-3000:]
    assert "rank1 sent to 127.0.0.1:" in log
    assert containers_of(run_id) == [] and leftovers(gpucloud_home, run_id) == []


def test_containerised_job_preempted_twice_resumes_from_its_checkpoint(
    tmp_path: Path, gpucloud_home: Path, container_lab: ContainerLab
) -> None:
    n = 150
    job = count_job(tmp_path / "job", container_lab.image, n, {"cloud": "local"})
    run_id, proc = preempted_twice(["gpucloud", "run", str(job)], gpucloud_home, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "restart 2 of 2 after preempted" in proc.stderr
    check_finished_count(gpucloud_home, run_id, tmp_path, n)
    log = (gpucloud_home / "runs" / run_id / "log.txt").read_text()
    assert log.count("stage container_pull") == 3 and log.count("preempted at ") == 2, log[-3000:]
    assert containers_of(run_id) == [] and leftovers(gpucloud_home, run_id) == []


def test_a_registry_that_never_answers_ends_at_the_deadline_not_in_a_hang(
    tmp_path: Path, gpucloud_home: Path, container_lab: ContainerLab
) -> None:
    """A registry that takes the connection and says nothing: the pull is stopped by the deadline."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    image = f"127.0.0.1:{silent.getsockname()[1]}/team/silent:1"
    try:
        job = write_job(
            tmp_path / "job", {"name": "boxhang", "max_duration": "8s", "container": image, "run": "echo never"}
        )
        t0 = time.monotonic()
        proc = cli("run", str(job), "--cloud", "local", "--json", cwd=tmp_path, timeout=120)
        assert proc.returncode == 124 and time.monotonic() - t0 < 60, proc.stderr
    finally:
        silent.close()
    run_id = json.loads(proc.stdout)["run_id"]
    status = status_json(run_id, tmp_path)
    assert status["status"] == "deadline", status
    log = (gpucloud_home / "runs" / run_id / "log.txt").read_text()
    assert log.index("stage container_pull") < log.index("max_duration passed") and "pull 1/3" not in log, log
    assert leftovers(gpucloud_home, run_id, image) == []  # no engine call still waiting on it
