"""The shim (user-data) and the agent behind it, run on this machine against a FileChannel as the
local provider would: size on every provider, shell lint, the hash check, and whole runs (success,
job failure, deadline, signal)."""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucloud.channel.run_objects import agent_key, node_prefix
from gpucloud.contract.registry import capabilities
from gpucloud.spec.load import load_spec
from gpucloud.vm.shim import SHIM_TARGET_BYTES, render_shim
from tests.support.agent_node import RUN_ID, local_node
from tests.support.s3_front import S3Front
from tests.support.vm_boot import Vm, make_vm

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
PROVIDERS = ("aws", "azure", "local", "ssh")
SHELLCHECK = Path(sys.executable).parent / "shellcheck"
# A presigned S3 GET with a session token is about 1.5 KB (bench_userdata_size.py); Azure SAS URLs are shorter.
LONG_URL = "https://gpucloud-123456789012-us-east-1.s3.amazonaws.com/runs/r/node-0/manifest?" + "X" * 1900
SHA = "0" * 64


def _shim(provider: str, max_duration: int = 86400, rank: int | None = 0) -> str:
    return render_shim(
        caps=capabilities(provider),
        run_id="run-20260101-abcd",
        max_duration=max_duration,
        agent_sha256=SHA,
        manifest_url=LONG_URL,
        node_rank=rank,
    )


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_user_data_is_at_most_4_kb_raw_for_every_example(example: Path, provider: str) -> None:
    spec = load_spec(example)
    for rank in (0, None):
        text = _shim(provider, int(spec.max_duration), rank)
        assert len(text.encode()) <= SHIM_TARGET_BYTES, (example.name, provider, len(text.encode()))


def test_shim_is_posix_sh_and_shellcheck_clean(tmp_path: Path) -> None:
    for provider in PROVIDERS:
        path = tmp_path / f"{provider}.sh"
        path.write_text(_shim(provider))
        assert subprocess.run(["sh", "-n", str(path)], check=False).returncode == 0
        if SHELLCHECK.exists():
            out = subprocess.run([str(SHELLCHECK), "-s", "sh", str(path)], capture_output=True, text=True, check=False)
            assert out.returncode == 0, out.stdout


def test_provider_differences_are_only_the_end_and_the_backstop() -> None:
    local, aws, azure = _shim("local"), _shim("aws"), _shim("azure")
    assert "shutdown -h now" not in local and "systemd-run" not in local
    assert "shutdown -h now" in aws and "shutdown -P" in aws and "systemd-run" in aws
    assert "shutdown -h now" in azure and "shutdown -P" not in azure
    assert len(gzip.compress(aws.encode())) < len(aws.encode())


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        render_shim(caps=capabilities("local"), run_id="bad id", max_duration=1, agent_sha256=SHA, manifest_url="")
    with pytest.raises(ValueError):
        render_shim(caps=capabilities("local"), run_id="r", max_duration=1, agent_sha256="xyz", manifest_url="")


# ---- whole runs ------------------------------------------------------------------------------------
def test_a_run_succeeds_signed_with_its_log_and_artifacts(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "hello.txt").write_text("hi from the code\n")
    node = local_node(
        tmp_path,
        run="cat hello.txt; mkdir -p out; echo 42 > out/x",
        setup="echo setup ran",
        artifacts=["out", "missing.txt"],
        env={"GREETING": "it's $HOME"},
    )
    proc = node.run()
    assert proc.returncode == 0, proc.stderr
    doc = node.status()
    assert doc is not None and (doc["state"], doc["exit_code"]) == ("succeeded", 0)
    raw = node.channel.get_bytes(f"{node_prefix(RUN_ID, 0)}/status.json") or b""
    assert b',"sig":"' in raw and doc["log_bytes"] > 0  # read_status takes it only signed (and drops the sig)
    log = b"".join(node.channel.read_log_parts(RUN_ID, 0))
    assert b"hi from the code" in log and b"setup ran" in log and b"artifact missing.txt not found" in log
    result = node.channel.download_artifacts(RUN_ID, 0, tmp_path / "got")
    assert result is not None and (tmp_path / "got" / "out" / "x").read_text() == "42\n"


def test_job_failure_is_reported_with_its_code(tmp_path: Path) -> None:
    node = local_node(tmp_path, run="echo failing; exit 3")
    proc = node.run()
    doc = node.status()
    assert proc.returncode == 3 and doc is not None
    assert (doc["state"], doc["exit_code"], doc["message"]) == ("failed", 3, "job exited with code 3")


def test_the_watchdog_ends_a_run_past_its_deadline(tmp_path: Path) -> None:
    node = local_node(tmp_path, run="sleep 60", max_duration=2)
    t = time.monotonic()
    proc = node.run()
    doc = node.status()
    assert proc.returncode == 124 and time.monotonic() - t < 45  # well before the job's own 60 s
    assert doc is not None and doc["state"] == "deadline" and doc["exit_code"] is None
    assert doc["message"].startswith("max_duration passed (deadline "), doc  # the watchdog's, not the backstop's


def test_a_signal_stops_the_job_and_reports_failed(tmp_path: Path) -> None:
    node = local_node(tmp_path, run="echo started; sleep 60")
    env = {**os.environ, "GPUCLOUD_VM_DIR": str(node.vm_dir)}
    proc = subprocess.Popen(["sh", str(node.shim)], env=env, stderr=subprocess.PIPE, start_new_session=True)
    for _ in range(200):
        doc = node.status()
        if doc and doc.get("stage") == "run":
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 143
    doc = node.status()
    assert doc is not None and doc["state"] == "failed"
    assert doc["message"].startswith("bootstrap stopped by a signal")


def test_a_swapped_agent_archive_is_refused(tmp_path: Path) -> None:
    node = local_node(tmp_path, run="echo should not run")
    node.channel.put_bytes(agent_key(RUN_ID), b"not the agent")
    proc = node.run()
    assert proc.returncode == 1 and "hash mismatch" in proc.stderr
    assert node.status() is None and not (node.vm_dir / "job.log").exists()


def _python38() -> str | None:
    """A real Python 3.8 (a pyenv install before PATH: pyenv's shims may pick another version)."""
    pyenv = sorted(Path.home().glob(".pyenv/versions/3.8.*/bin/python3.8"))
    if pyenv:
        return str(pyenv[-1])
    found = shutil.which("python3.8")
    return found if found and ".pyenv/shims" not in found else None


def test_the_agent_runs_on_python_3_8(tmp_path: Path) -> None:
    """Ubuntu 20.04 (the Kepler hosts) has Python 3.8: the agent is stdlib-only py38 code."""
    py38 = _python38()
    if py38 is None:
        pytest.skip("no Python 3.8 here")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(py38)
    node = local_node(tmp_path, run="python3 --version; mkdir -p out; echo 1 > out/f", artifacts=["out"])
    proc = node.run(env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    doc = node.status()
    assert proc.returncode == 0 and doc is not None and doc["state"] == "succeeded", proc.stderr
    assert b"Python 3.8" in b"".join(node.channel.read_log_parts(RUN_ID, 0))


# ---- a store that redirects or refuses (S3's global name: tests/support/s3_front.py) ----------------
def _fronted(tmp: Path, front: S3Front, run: str = "mkdir -p out; echo 42 > out/x", max_duration: int = 600) -> Vm:
    return make_vm(
        tmp,
        run=run,
        artifacts=["out"],
        deadline_s=max_duration,
        max_duration=max_duration,
        url_map=front.url_map,
        stub_env={"GPUCLOUD_DEADLINE_GRACE": "3", "GPUCLOUD_VM_SANDBOX": str(tmp / "vm"), "TMPDIR": str(tmp)},
    )


def test_the_shim_retries_a_redirected_manifest_and_never_keeps_the_redirect(tmp_path: Path) -> None:
    """A 307 answer (its body an S3 error document) is no manifest: fetched again until a 2xx."""
    front = S3Front(tmp_path / "channel", redirects=2, only=lambda m, p: p.endswith("/manifest")).start()
    try:
        vm = _fronted(tmp_path, front).run(timeout=60)
    finally:
        front.stop()
    assert vm.rc == 0, vm.stderr
    assert front.codes("/manifest")[:3] == [307, 307, 200]
    assert "gpucloud: manifest: HTTP 307 (curl 0)" in vm.stderr
    assert vm.status()["state"] == "succeeded"


def test_a_node_whose_puts_get_307_retries_until_every_object_lands(tmp_path: Path) -> None:
    """Status, log parts and artifacts: each PUT answered 307 twice lands on a later try."""
    front = S3Front(tmp_path / "channel", redirects=2, only=lambda m, p: m in ("PUT", "POST")).start()
    try:
        vm = _fronted(tmp_path, front, run="echo from-the-job; mkdir -p out; echo 42 > out/x").run(timeout=90)
    finally:
        front.stop()
    assert vm.rc == 0, vm.stderr
    doc = vm.status()
    assert (doc["state"], doc["exit_code"]) == ("succeeded", 0)
    assert "from-the-job" in vm.log()
    got = vm.channel.download_artifacts(vm.run_id, 0, tmp_path / "got")
    assert got is not None and (tmp_path / "got" / "out" / "x").read_text() == "42\n"
    for end in ("/status.json", "/artifacts.tar.gz"):
        assert front.codes(end)[:3] == [307, 307, 200], (end, front.codes(end))
    assert "status.json: HTTP 307 (curl exit 0); not delivered" in vm.stderr


@pytest.mark.parametrize("code", [307, 400])
def test_a_node_that_only_gets_redirects_or_refusals_ends_by_its_deadline(tmp_path: Path, code: int) -> None:
    """The manifest never arrives: the shim ends the machine at max_duration, the code on its console."""
    front = S3Front(tmp_path / "channel", redirects=10**9, wrong_region=code == 400).start()
    t0 = time.monotonic()
    try:
        vm = _fronted(tmp_path, front, max_duration=4).run(timeout=60)
    finally:
        front.stop()
    took = time.monotonic() - t0
    assert vm.rc == 1 and 4 <= took < 4 + 16 + 10, (vm.rc, took, vm.stderr)
    assert f"gpucloud: manifest: HTTP {code} (curl 0)" in vm.stderr
    assert set(front.codes()) == {code}
    assert vm.channel.read_status(vm.run_id, 0) is None


def test_an_agent_whose_puts_only_get_307_ends_by_its_deadline_saying_so(tmp_path: Path) -> None:
    """Past the manifest every upload is redirected: the job is stopped at its deadline, nothing
    counts as delivered, and the console names the code and the objects."""
    front = S3Front(tmp_path / "channel", redirects=10**9, only=lambda m, p: m in ("PUT", "POST")).start()
    t0 = time.monotonic()
    try:
        vm = _fronted(tmp_path, front, run="echo started; sleep 60", max_duration=4).run(timeout=90)
    finally:
        front.stop()
    took = time.monotonic() - t0
    # the watchdog stops the job at 4 s; the backstop ends the machine at 4 + 3 s of grace at the latest
    assert vm.rc in (124, -signal.SIGKILL) and took < 4 + 3 + 10, (vm.rc, took, vm.stderr)
    assert "max_duration passed" in vm.stderr
    assert vm.channel.read_status(vm.run_id, 0) is None  # a redirect never counted as the status
    assert "status.json: HTTP 307 (curl exit 0); not delivered" in vm.stderr
    assert set(front.codes("/status.json")) == {307}


def test_everything_the_agent_writes_is_private_to_its_user(tmp_path: Path) -> None:
    """umask 077 from the agent's start: on a shared host no other user reads the node's key, its
    manifest's grants, the code, the logs or the artifacts. What the shim itself unpacks (`agent/`,
    before the agent starts) is the shim's."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "code.py").write_text("print('hi')\n")
    node = local_node(tmp_path, run="mkdir -p out; echo 42 > out/x; python3 code.py", artifacts=["out"])
    old = os.umask(0o022)  # the usual umask of a login: the agent must not keep it
    try:
        proc = node.run()
    finally:
        os.umask(old)
    assert proc.returncode == 0, proc.stderr
    shim_own = {node.vm_dir / "agent", node.vm_dir / "agent.tar.gz"}
    seen, open_to_others = 0, []
    for path in node.vm_dir.rglob("*"):
        if any(p in shim_own for p in (path, *path.parents)) or path.is_symlink():
            continue
        seen += 1
        if path.stat().st_mode & 0o077:
            open_to_others.append(f"{path.relative_to(node.vm_dir)} {oct(path.stat().st_mode & 0o777)}")
    assert seen > 10 and open_to_others == [], open_to_others
