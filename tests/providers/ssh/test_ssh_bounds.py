"""What a host answers is bounded, and only the run's own processes are signalled, through the CLI
against real OpenSSH servers (tests/support/sshd.py): a hung and a flooding nvidia-smi, a
superscript digit, a login that prints nothing, terminal escapes, a status.json linked to
/dev/zero, a recorded pid that now belongs to someone else, and `down` with the host unreachable
(down-pending, then torn down once the host is back)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import cli
from tests.support.hostile_jobs import POISON_STATUS
from tests.support.polling import wait_until
from tests.support.ssh_runs import job, run_processes, start_detached
from tests.support.sshd import SSHD, SshdServer, SshLab, have_sshd
from tests.support.text import flat

pytestmark = pytest.mark.skipif(not have_sshd(), reason="needs /usr/sbin/sshd and ssh (openssh-server)")

HUNG_SMI = "#!/bin/bash\nsleep 613\n"
FLOOD_SMI = "#!/bin/bash\nexec yes '0, Tesla T4, 15360, 535.104.05 flood-617'\n"
SUPER_SMI = "#!/bin/bash\necho '\u00b2, Tesla T4, 15360, 535.104.05'\n"
ESCAPE_SMI = "#!/bin/bash\nprintf '0, Tesla T4\\033]0;pwned\\007\\033[2J, 15360, 535.104.05\\n'\n"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshLab]:
    lab = SshLab(tmp_path_factory.mktemp("sshb") / "lab")
    lab.add_server("hung", smi=HUNG_SMI)
    lab.add_server("flood", smi=FLOOD_SMI)
    lab.add_server("super", smi=SUPER_SMI)
    lab.add_server("escape", smi=ESCAPE_SMI)
    lab.add_server("mute", force_command="true")
    lab.add_server("box")
    lab.add_server("far")
    yield lab
    lab.close()


@pytest.fixture
def cli_env(lab: SshLab, gpucloud_home: Path) -> dict[str, str]:
    from tests.conftest import REPO

    return {**os.environ, **lab.env(), "GPUCLOUD_HOME": str(gpucloud_home), "CI": "true", "PYTHONPATH": str(REPO)}


def server(lab: SshLab, alias: str) -> SshdServer:
    return next(s for s in lab.servers if s.alias == alias)


def procs_with(token: bytes) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token in (entry / "cmdline").read_bytes():
                    state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
                    if state not in ("Z", "X"):
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_hung_nvidia_smi_is_stopped_and_named(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    spec = job(tmp_path, "hung", "resources: {cloud: ssh, gpu: T4:1, hosts: [hung]}\nrun: x\n")
    t0 = time.monotonic()
    res = cli("plan", str(spec), cwd=tmp_path, timeout=150, env=cli_env)
    took = time.monotonic() - t0
    assert res.returncode == 2, res.stderr
    assert "nvidia-smi did not answer within 20 s" in flat(res.stderr) and "cannot reach" not in res.stderr, res.stderr
    assert took < 50, f"plan took {took:.0f}s"
    assert wait_until(lambda: not procs_with(b"sleep\x00613"), 10), "the hung nvidia-smi is left running"


def test_flooding_nvidia_smi_is_cut(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = cli("hosts", "probe", "flood", "--json", cwd=tmp_path, timeout=150, env=cli_env)
    took = time.monotonic() - t0
    assert res.returncode != 70 and "Traceback" not in res.stderr, res.stderr
    (doc,) = json.loads(res.stdout)
    assert "printed more than 65536 bytes" in doc["nvidia_smi_error"] and doc["gpus"] == []
    assert took < 30, f"probe took {took:.0f}s"
    assert wait_until(lambda: not procs_with(b"flood-617"), 10), "the flooding nvidia-smi is left running"


def test_odd_answers_get_a_clear_verdict(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    sup = cli("hosts", "probe", "super", "--json", cwd=tmp_path, env=cli_env, timeout=180)
    assert sup.returncode != 70 and "Traceback" not in sup.stderr, sup.stderr
    assert json.loads(sup.stdout)[0]["gpus"] == []
    mute = cli("hosts", "probe", "mute", cwd=tmp_path, env=cli_env, timeout=180)
    assert mute.returncode != 70 and "Traceback" not in mute.stderr, mute.stderr
    assert "the probe printed nothing gpucloud understands" in mute.stdout + mute.stderr
    esc = cli("hosts", "probe", "escape", cwd=tmp_path, env=cli_env, timeout=180)
    assert esc.returncode != 70, esc.stderr
    out = esc.stdout + esc.stderr
    assert "\x1b" not in out and "\x07" not in out and "\\x1b]0;pwned" in out, out


def test_status_linked_to_dev_zero_is_refused(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    box = server(lab, "box")
    spec = job(tmp_path, "poison", "resources: {cloud: ssh, hosts: [box]}\nrun: " + json.dumps(POISON_STATUS) + "\n")
    t0 = time.monotonic()
    res = cli("run", str(spec), cwd=tmp_path, timeout=120, env=cli_env)
    assert res.returncode == 65, res.stderr
    assert "status was refused" in flat(res.stderr) and "not a regular file" in flat(res.stderr), res.stderr
    assert time.monotonic() - t0 < 60
    assert not list((box.remote_root / "work").iterdir()), "torn down"


def test_down_never_signals_a_reused_pid(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    """The run's processes died without cleaning up (a crash, a reboot) and the numbers in its pid
    files now belong to an unrelated process (the kernel reuses them): `down` and `gc` leave that
    process alone. A second run that is alive is still torn down by `down`."""
    box = server(lab, "box")
    spec = job(tmp_path, "reuse", "resources: {cloud: ssh, hosts: [box]}\nrun: echo up; sleep 300\n")
    run_id, node = start_detached(cli_env, spec, tmp_path, box)
    for pid in run_processes(run_id):
        with contextlib.suppress(ProcessLookupError):  # a child may end with its parent first
            os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not run_processes(run_id), 10)
    decoy = subprocess.Popen(["sleep", "301"], start_new_session=True)
    try:
        (node / "pid").write_text(f"{decoy.pid}\n")
        (node / "job.pgid").write_text(f"{decoy.pid}\n")
        (node / "expires").write_text(f"{int(time.time()) - 60}\n")
        assert cli("gc", "--cloud", "ssh", "--yes", cwd=tmp_path, env=cli_env, timeout=180).returncode == 0
        res = cli("down", run_id, "--yes", cwd=tmp_path, env=cli_env, timeout=180)
        assert res.returncode == 0, res.stderr
        time.sleep(0.5)
        assert decoy.poll() is None, "down or gc signalled a process that is not the run's"
        assert not node.exists()
    finally:
        decoy.kill()
        decoy.wait()
    alive, _ = start_detached(
        cli_env,
        job(tmp_path, "alive", "resources: {cloud: ssh, hosts: [box]}\nrun: echo up; sleep 300\n"),
        tmp_path,
        box,
    )
    assert run_processes(alive)
    assert cli("down", alive, "--yes", cwd=tmp_path, env=cli_env, timeout=180).returncode == 0
    assert wait_until(lambda: not run_processes(alive), 10)


def _cut_off(lab: SshLab, box: SshdServer, env: dict[str, str]) -> socket.socket:
    """The host stops answering: its sshd and sessions end, the CLI's master is gone, and its
    port accepts connections that never answer (a hung host or a black-holed route)."""
    for sock in Path(env["GPUCLOUD_SSH_CONTROL_DIR"]).glob("*"):
        subprocess.run(
            ["ssh", "-F", str(lab.config), "-o", f"ControlPath={sock}", "-O", "exit", "x"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    sessions = box.session_pids()
    box.stop()
    for pid in sessions:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    silent = socket.socket()
    silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    silent.bind(("127.0.0.1", box.port))
    silent.listen(16)
    return silent


def _restart(box: SshdServer) -> None:
    log = box.log_path.open("ab")
    box.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(box.folder / "sshd_config")], stdout=log, stderr=log)
    assert wait_until(lambda: socket.socket().connect_ex(("127.0.0.1", box.port)) == 0, 10)


def _status(env: dict[str, str], run_id: str) -> str:
    import sqlite3

    conn = sqlite3.connect(Path(env["GPUCLOUD_HOME"]) / "state.db")
    try:
        return str(conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()[0])
    finally:
        conn.close()


def test_down_with_the_host_unreachable_is_down_pending(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    box = server(lab, "far")
    spec = job(tmp_path, "far", "resources: {cloud: ssh, hosts: [far]}\nrun: echo up; sleep 300\n")
    run_id, node = start_detached(cli_env, spec, tmp_path, box)
    silent = _cut_off(lab, box, cli_env)
    try:
        t0 = time.monotonic()
        res = cli("down", run_id, "--yes", cwd=tmp_path, timeout=200, env=cli_env)
        took = time.monotonic() - t0
        assert res.returncode == 75, res.stderr
        assert "not reached" in res.stderr and "down-pending" in res.stderr and "Traceback" not in res.stderr
        assert took < 45, f"down took {took:.0f}s"
        assert _status(cli_env, run_id) == "down-pending"
        assert run_processes(run_id), "the job is still running on the host"
    finally:
        silent.close()
    _restart(box)
    again = cli("down", run_id, "--yes", cwd=tmp_path, timeout=120, env=cli_env)
    assert again.returncode == 0, again.stderr
    assert _status(cli_env, run_id) == "down"
    assert wait_until(lambda: not run_processes(run_id), 10)
    assert not node.exists()


def test_a_large_artifact_over_ssh_is_streamed_to_disk(lab: SshLab, cli_env: dict[str, str], tmp_path: Path) -> None:
    """The ssh channel writes the artifacts tarball to a file as it arrives (before, one `ssh cat`
    held the whole object in the CLI's memory): `gpucloud run` brings back a 192 MiB incompressible
    artifact with far less than that in RAM."""
    import sys

    size_mib = 192
    make = f"mkdir -p out && head -c {size_mib}M /dev/urandom > out/big.bin"
    body = "resources: {cloud: ssh, hosts: [box]}\nrun: " + json.dumps(make) + "\nartifacts: [out/]\n"
    spec = job(tmp_path, "big", body)
    probe = (
        "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)"
    )
    res = subprocess.run(
        [sys.executable, "-c", probe, sys.executable, "-m", "gpucloud", "run", str(spec)],
        env=cli_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    peak_mib = int(res.stdout.strip().splitlines()[-1]) / 1024
    found = list((tmp_path / "gpucloud-runs").rglob("big.bin"))
    assert len(found) == 1 and found[0].stat().st_size == size_mib * 1024 * 1024
    assert peak_mib < 150, f"run took {peak_mib:.0f} MiB of RAM for a {size_mib} MiB artifact over ssh"
