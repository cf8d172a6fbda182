"""The ssh provider end to end, through the CLI, against real OpenSSH servers on 127.0.0.1
(tests/support/sshd.py): probe and plan (Kepler stack for a K40 host), the quickstart, exit codes,
max_duration, Ctrl-C, a dropped connection, two nodes on two hosts, two runs on one host, and an
unknown host key."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support.cli import cli
from tests.support.polling import wait_until
from tests.support.ssh_runs import cli_env, job, lab, run_processes, server, start_detached  # noqa: F401  (fixtures)
from tests.support.sshd import SshdServer, SshLab, have_sshd
from tests.support.text import flat

pytestmark = pytest.mark.skipif(not have_sshd(), reason="needs /usr/sbin/sshd and ssh (openssh-server)")


def start_run(env: dict[str, str], spec: Path, cwd: Path, box: SshdServer) -> subprocess.Popen[str]:
    """`gpucloud run` in the background, returned once its job is running on the host."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpucloud", "run", str(spec)],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert wait_until(lambda: any((box.remote_root / "work").rglob("job.pgid")), 90)
    return proc


def wait_until(predicate, timeout: float = 60.0, step: float = 0.2) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return False


def test_probe_and_plan_resolve_kepler_for_a_k40_host(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    probe = cli("hosts", "probe", "k40box", "--gpu", "K40:1", "--json", cwd=tmp_path, env=cli_env, timeout=180)
    assert probe.returncode == 0, probe.stderr
    (doc,) = json.loads(probe.stdout)
    assert doc["gpus"][0]["model"] == "K40" and doc["driver"] == "470.182.03" and doc["cuda"] == "11.4"
    assert doc["stack"]["architecture"] == "Kepler" and doc["disk_free_gib"] > 0
    spec = job(tmp_path, "k40job", "resources: {cloud: ssh, gpu: K40:1, hosts: [k40box]}\nrun: nvidia-smi\n")
    plan = cli("plan", str(spec), "--json", cwd=tmp_path, env=cli_env, timeout=180)
    assert plan.returncode == 0, plan.stderr
    stack = json.loads(plan.stdout)["stack"]
    assert (stack["driver"], stack["cuda"], stack["cudnn"][:3]) == ("470", "11.4", "8.2")
    # The same job on the clouds: the K40 was never offered there.
    cloud = cli(
        "plan",
        str(job(tmp_path, "k40cloud", "resources: {gpu: K40:1}\nrun: x\n")),
        cwd=tmp_path,
        env=cli_env,
        timeout=180,
    )
    assert cloud.returncode == 2 and "never offered" in flat(cloud.stderr)
    # A host with another GPU is refused with what it has.
    wrong = cli("plan", str(spec), "--host", "t4box", cwd=tmp_path, env=cli_env, timeout=180)
    assert wrong.returncode == 2 and "has 0 x K40" in flat(wrong.stderr) and "Tesla T4" in flat(wrong.stderr)


def test_quickstart_on_an_ssh_host_with_one_handshake(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    box = server(lab, "t4box")
    before = box.accepted()
    res = cli(
        "run",
        str(REPO / "examples" / "quickstart.yaml"),
        "--host",
        "t4box",
        "--json",
        cwd=tmp_path,
        env=cli_env,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["status"] == "succeeded"
    assert (Path(doc["artifacts_dir"]) / "metrics.json").is_file()
    assert box.accepted() - before == 1, "plan, launch, follow and teardown share one ssh connection"
    assert not list((box.remote_root / "work").iterdir()), "teardown removes the work folder"
    assert not list((box.remote_root / "locks").glob("gpu-*")), "and the GPU lock"


def test_failing_job_exit_code(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    spec = job(tmp_path, "fails", "resources: {cloud: ssh, hosts: [cpu1]}\nrun: echo about to fail; exit 3\n")
    res = cli("run", str(spec), cwd=tmp_path, env=cli_env, timeout=180)
    assert res.returncode == 3, res.stderr
    assert "about to fail" in res.stdout + res.stderr


def test_max_duration_gives_124(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    spec = job(tmp_path, "slow", "resources: {cloud: ssh, hosts: [cpu1]}\nrun: sleep 120\nmax_duration: 4s\n")
    t0 = time.monotonic()
    res = cli("run", str(spec), cwd=tmp_path, env=cli_env, timeout=180)
    assert res.returncode == 124, res.stderr
    assert time.monotonic() - t0 < 60


def test_ctrl_c_gives_130_and_leaves_nothing(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    box = server(lab, "t4box")
    spec = job(
        tmp_path, "interrupted", "resources: {cloud: ssh, gpu: T4:1, hosts: [t4box]}\nrun: echo started; sleep 300\n"
    )
    proc = start_run(cli_env, spec, tmp_path, box)
    assert any((box.remote_root / "locks").glob("gpu-*"))
    run_id = next((box.remote_root / "work").iterdir()).name
    assert run_processes(run_id)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, out
    assert not (box.remote_root / "work" / run_id).exists()
    assert not list((box.remote_root / "locks").glob("gpu-*"))
    assert wait_until(lambda: not run_processes(run_id), 10), [
        Path(f"/proc/{p}/cmdline").read_bytes() for p in run_processes(run_id)
    ]


def drop_connection(box: SshdServer, env: dict[str, str], alias: str) -> None:
    """Kill the host's ControlMaster (client side) and every sshd session process (server side)."""
    from gpucloud.providers.ssh import transport as ssh_transport

    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        host = ssh_transport.SshHost.parse(alias)
        check = ["ssh", *ssh_transport.base_args(host), "-O", "check", *host.destination()]
        proc = subprocess.run(check, capture_output=True, text=True, timeout=30, check=False)
        found = re.search(r"pid=(\d+)", proc.stderr + proc.stdout)  # the ControlMaster's, if one is up
        pid = int(found.group(1)) if found else None
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert pid, "the run keeps a ControlMaster up for reuse"
    os.kill(pid, signal.SIGKILL)
    for session in box.session_pids():
        with contextlib.suppress(ProcessLookupError):  # it may end by itself once its master is gone
            os.kill(session, signal.SIGKILL)


def test_dropped_connection_run_carries_on(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    box = server(lab, "cpu1")
    spec = job(
        tmp_path,
        "dropped",
        "resources: {cloud: ssh, hosts: [cpu1]}\n"
        "run: for i in 1 2 3 4 5 6; do echo tick $i; sleep 1; done; echo finished\n",
    )
    # Attached: the CLI following the run reconnects (a new master) and sees it to the end.
    proc = start_run(cli_env, spec, tmp_path, box)
    drop_connection(box, cli_env, "cpu1")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "tick 6" in out and "finished" in out, out
    # Detached: nobody is connected when the connection drops; `logs --follow` picks the run up.
    res = cli("run", str(spec), "--detach", cwd=tmp_path, env=cli_env, timeout=180)
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.strip().splitlines()[-1]
    drop_connection(box, cli_env, "cpu1")
    assert wait_until(lambda: bool(run_processes(run_id)), 5), "the bootstrap did not die with the ssh session"
    follow = cli("logs", run_id, "--follow", cwd=tmp_path, env=cli_env, timeout=180)
    assert follow.returncode == 0, follow.stderr
    assert "tick 6" in follow.stdout and "finished" in follow.stdout
    status = json.loads(cli("status", run_id, "--json", cwd=tmp_path, env=cli_env, timeout=180).stdout)
    assert status["status"] == "succeeded"
    assert cli("down", run_id, "--yes", cwd=tmp_path, env=cli_env, timeout=180).returncode == 0
    assert not (box.remote_root / "work" / run_id).exists()


def test_two_nodes_on_two_hosts(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    spec = job(
        tmp_path,
        "pair",
        "resources: {cloud: ssh, hosts: [cpu1, cpu2]}\nnum_nodes: 2\n"
        'run: echo "rank=$NODE_RANK of $GPUCLOUD_NUM_NODES master=$MASTER_ADDR:$MASTER_PORT"\n',
    )
    res = cli("run", str(spec), cwd=tmp_path, env=cli_env, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout + res.stderr
    lines = [line for line in out.splitlines() if "rank=" in line and "master=" in line]
    assert any(line.startswith("[node 0]") and "rank=0 of 2" in line for line in lines), out
    assert any(line.startswith("[node 1]") and "rank=1 of 2" in line for line in lines), out
    masters = {line.split("master=")[1] for line in lines}
    assert len(masters) == 1, "both nodes agree on MASTER_ADDR:MASTER_PORT (the first host's)"
    for alias in ("cpu1", "cpu2"):
        assert not list((server(lab, alias).remote_root / "work").iterdir())
    # Detached, nobody following: the provider's relay still carries the barrier across hosts.
    detached = cli("run", str(spec), "--detach", cwd=tmp_path, env=cli_env, timeout=180)
    assert detached.returncode == 0, detached.stderr
    run_id = detached.stdout.strip().splitlines()[-1]
    node1_log = server(lab, "cpu2").remote_root / "work" / run_id / "node-1" / "job.log"
    assert wait_until(lambda: node1_log.is_file() and "rank=1 of 2" in node1_log.read_text(errors="replace"), 60), (
        "node 1 got past the barrier with no CLI reading the run"
    )
    follow = cli("logs", run_id, "--follow", cwd=tmp_path, env=cli_env, timeout=180)
    assert follow.returncode == 0 and "[node 1] rank=1 of 2" in follow.stdout, follow.stdout + follow.stderr
    assert cli("down", run_id, "--yes", cwd=tmp_path, env=cli_env, timeout=180).returncode == 0


def test_two_runs_compete_for_one_gpu(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    body = "resources: {cloud: ssh, gpu: T4:1, hosts: [t4box]}\nrun: echo gpus=$CUDA_VISIBLE_DEVICES; sleep 60\n"
    first = cli("run", str(job(tmp_path, "first", body)), "--detach", cwd=tmp_path, env=cli_env, timeout=180)
    assert first.returncode == 0, first.stderr
    first_id = first.stdout.strip().splitlines()[-1]
    second = cli("run", str(job(tmp_path, "second", body)), cwd=tmp_path, env=cli_env, timeout=180)
    assert second.returncode == 75, second.stderr
    assert f"held by run {first_id}" in flat(second.stderr)
    listing = cli("ls", cwd=tmp_path, env=cli_env, timeout=180)
    assert first_id in listing.stdout and "ssh/t4box" in listing.stdout
    probe = cli("hosts", "probe", "t4box", cwd=tmp_path, env=cli_env, timeout=180)
    assert f"locked by run {first_id}" in probe.stdout
    assert cli("down", first_id, "--yes", cwd=tmp_path, env=cli_env, timeout=180).returncode == 0
    again = cli(
        "run", str(job(tmp_path, "third", body.replace("sleep 60", "true"))), cwd=tmp_path, env=cli_env, timeout=180
    )
    assert again.returncode == 0, again.stderr
    assert "gpus=0" in again.stdout + again.stderr


def test_unknown_host_key_is_refused_with_the_fix(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    res = cli("hosts", "probe", "stranger", cwd=tmp_path, env=cli_env, timeout=180)
    assert res.returncode == 2, res.stderr
    assert "host key" in flat(res.stderr) and "ssh-keyscan" in flat(res.stderr)
    assert "Traceback" not in res.stderr
    assert not lab.known_hosts.read_text().count(str(server(lab, "stranger").port))


def test_driver_install_needs_install_true(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    box = server(lab, "bare")
    probe = cli("hosts", "probe", "bare", "--gpu", "K40:1", cwd=tmp_path, env=cli_env, timeout=180)
    assert probe.returncode == 78 and "no working NVIDIA driver" in probe.stdout, probe.stdout + probe.stderr
    body = (
        "resources: {cloud: ssh, gpu: K40:1, hosts: [bare]}\n"
        "run: nvidia-smi --query-gpu=name,driver_version --format=csv\n"
    )
    refused = cli("run", str(job(tmp_path, "nodriver", body)), cwd=tmp_path, env=cli_env, timeout=180)
    assert refused.returncode == 2 and "apt-get install -y cuda-drivers-470" in flat(refused.stderr), refused.stderr
    assert not (box.folder / "state" / "pkgs" / "cuda-drivers-470").exists(), "nothing installed without consent"
    res = cli(
        "run", str(job(tmp_path, "install", "stack: {install: true}\n" + body)), cwd=tmp_path, env=cli_env, timeout=180
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Tesla K40m, 470.82.01" in res.stdout + res.stderr
    calls = (box.folder / "state" / "calls").read_text()
    assert "dpkg -i cuda-keyring_1.1-1_all.deb" in calls and "apt-get install -y cuda-drivers-470" in calls


def test_gc_removes_an_expired_runs_leftovers(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    """A detached run whose expiry passed (its CLI gone, say) and a day-old folder of a run that
    ended: `gc --dry-run` lists both and touches nothing; `gc --yes` kills the run's processes and
    removes its folders and GPU lock."""
    box = server(lab, "t4box")
    spec = job(tmp_path, "forgotten", "resources: {cloud: ssh, gpu: T4:1, hosts: [t4box]}\nrun: echo up; sleep 300\n")
    run_id, node = start_detached(cli_env, spec, tmp_path, box)
    assert run_processes(run_id)
    (node / "expires").write_text(f"{int(time.time()) - 60}\n")  # the expiry tag passed a minute ago
    old = box.remote_root / "work" / "ended-20260101-000000-abcd" / "node-0"  # a run that ended two days ago
    old.mkdir(parents=True)
    ended = subprocess.Popen(["true"])
    ended.wait()
    (old / "pid").write_text(f"{ended.pid}\n")  # a process that is gone
    (old / "expires").write_text("0\n")
    two_days = time.time() - 2 * 86400
    os.utime(old / "expires", (two_days, two_days))

    dry = cli("gc", "--dry-run", "--cloud", "ssh", cwd=tmp_path, env=cli_env, timeout=180)
    assert dry.returncode == 0, dry.stderr
    assert f"ssh: t4box: {run_id}/node-0 expired, still running (would remove)" in dry.stdout, dry.stdout
    assert "ssh: t4box: ended-20260101-000000-abcd/node-0 ended over a day ago (would remove)" in dry.stdout
    assert node.is_dir() and old.is_dir() and run_processes(run_id)

    swept = cli("gc", "--yes", "--cloud", "ssh", cwd=tmp_path, env=cli_env, timeout=180)
    assert swept.returncode == 0, swept.stderr
    assert f"{run_id}/node-0 expired, still running (removed)" in swept.stdout, swept.stdout
    assert not (box.remote_root / "work" / run_id).exists() and not old.parent.exists()
    assert not [f for f in (box.remote_root / "locks").glob("gpu-*") if f.read_text().strip() == run_id]
    assert wait_until(lambda: not run_processes(run_id), 10)
    from gpucloud.state.runs_db import Store

    assert Store(Path(cli_env["GPUCLOUD_HOME"]) / "state.db").resources(run_id, alive_only=True) == [], (
        "the swept node's row is marked deleted"
    )
    again = cli("gc", "--dry-run", "--cloud", "ssh", cwd=tmp_path, env=cli_env, timeout=180)
    assert run_id not in again.stdout and "ended-20260101-000000-abcd" not in again.stdout


def day_old_node(folder: Path) -> None:
    """A node folder as a run that ended two days ago leaves it (its process long gone)."""
    folder.mkdir(parents=True)
    (folder / "pid").write_text("999999999\n")
    (folder / "expires").write_text("0\n")
    two_days = time.time() - 2 * 86400
    os.utime(folder / "expires", (two_days, two_days))


def test_gc_removes_only_what_is_provably_the_runs(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    """A folder under work/ whose name is not a run id is named and left alone; a run's channel
    folder reached through a link (`channel/runs` pointing elsewhere) is refused, named, and gc
    exits 75: nothing outside the remote root is removed."""
    box = server(lab, "cpu2")
    res = cli(
        "run",
        str(job(tmp_path, "seen", "resources: {cloud: ssh, hosts: [cpu2]}\nrun: echo hi\n")),
        cwd=tmp_path,
        env=cli_env,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr  # a recorded run on the host: gc visits it
    root = box.remote_root
    day_old_node(root / "work" / "notarun" / "node-0")
    run_id = "ended-20260101-000000-abcd"
    day_old_node(root / "work" / run_id / "node-0")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / run_id).mkdir(parents=True)
    (elsewhere / run_id / "thesis.tex").write_text("years of work")
    runs = root / "channel" / "runs"
    moved = root / "channel" / "runs.real"
    runs.rename(moved)
    runs.symlink_to(elsewhere)
    try:
        swept = cli("gc", "--yes", "--cloud", "ssh", cwd=tmp_path, env=cli_env, timeout=180)
    finally:
        runs.unlink()
        moved.rename(runs)
    out = flat(swept.stdout + swept.stderr)
    assert swept.returncode == 75, out
    assert "ssh: cpu2: work/@ended notarun node-0: not a gpucloud run's folder, left alone" in out
    assert f"{run_id}/node-0 ended over a day ago (NOT removed: channel/runs/{run_id} not removed" in out
    assert "gc could not finish" in out
    assert (elsewhere / run_id / "thesis.tex").is_file() and (root / "work" / "notarun" / "node-0").is_dir()
    assert not (root / "work" / run_id).exists()  # its own work folder, proven, is gone
    shutil.rmtree(root / "work" / "notarun")


def test_remote_files_are_private(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    """Code, inputs, logs, the bootstrap and channel objects on the host: 0600 files in 0700
    folders (umask 077), whatever the host's default umask."""
    box = server(lab, "cpu1")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "train.py").write_text("print('hi')\n")
    spec = job(tmp_path, "private", "resources: {cloud: ssh, hosts: [cpu1]}\nworkdir: work\nrun: echo up; sleep 300\n")
    run_id, node = start_detached(cli_env, spec, tmp_path, box)
    try:
        paths = [box.remote_root / "work" / run_id, box.remote_root / "channel" / "runs" / run_id]
        found = [p for top in paths for p in [top, *top.rglob("*")] if not p.is_symlink()]
        assert len(found) > 10 and (node / "bootstrap.sh") in found and (node / "console.log") in found
        # The node's own extractions (node-N/agent/, node-N/job/) are the agent's to make private;
        # the folders around them, which no one else can enter, are the provider's.
        theirs = [node / "agent", node / "job"]
        loose = [
            f"{oct(p.stat().st_mode & 0o777)} {p}"
            for p in found
            if p.stat().st_mode & 0o077 and (p.is_dir() or not any(t in p.parents for t in theirs))
        ]
        assert not loose, "\n".join(loose)
    finally:
        assert cli("down", run_id, "--yes", cwd=tmp_path, env=cli_env, timeout=180).returncode == 0


def test_down_of_a_job_that_ignores_sigterm_leaves_no_process(
    lab: SshLab, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """The bootstrap outlives teardown's grace (it gives the job 5 s after SIGTERM), so teardown
    KILLs it; its deadline backstop, in a session of its own, must go too (it would otherwise KILL
    process groups by number at the deadline, on a machine other people use)."""
    box = server(lab, "cpu1")
    spec = job(tmp_path, "stubborn", "resources: {cloud: ssh, hosts: [cpu1]}\nrun: trap '' TERM; echo up; sleep 300\n")
    run_id, _node = start_detached(cli_env, spec, tmp_path, box)
    assert wait_until(
        lambda: any(
            b"backstop" in Path(f"/proc/{p}/cmdline").read_bytes()
            for p in run_processes(run_id)
            if Path(f"/proc/{p}").exists()
        ),
        10,
    )
    parts = box.remote_root / "channel" / "runs" / run_id / "node-0" / "log"
    assert wait_until(lambda: any(b"up" in p.read_bytes() for p in parts.glob("0*")), 10)
    assert cli("down", run_id, "--yes", cwd=tmp_path, env=cli_env, timeout=180).returncode == 0
    assert wait_until(lambda: not run_processes(run_id), 10), [
        Path(f"/proc/{p}/cmdline").read_bytes() for p in run_processes(run_id)
    ]
    assert not (box.remote_root / "work" / run_id).exists()
    # Teardown removed the host's channel folder: `down` copied the log first (nobody followed the run).
    assert not parts.exists()
    assert "up" in cli("logs", run_id, cwd=tmp_path, env=cli_env, timeout=180).stdout.splitlines()
