"""The rendered shim and its agent, run for real by bash against a FileChannel in a temp folder.

Stack installs run with the stub apt-get/dpkg/nvidia-smi/python3 of tests/support/vm_stubs on PATH
(they record their argv); curl, tar and setsid are real. Intervals are rendered small so that every
run takes about a second.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpucloud.plan.stacks import Stack
from tests.support.polling import wait_until
from tests.support.render_inputs import K80, NASTY, T4
from tests.support.vm_boot import Vm, make_vm

APT = "apt-get -o DPkg::Lock::Timeout=600 -o Acquire::Retries=3 install -y --no-install-recommends "
# Headers of the running kernel, and from R580 NVIDIA's version-locking package, go in before the driver.
HEADERS = APT + f"linux-headers-{os.uname().release}"
LOCK_580 = HEADERS + " nvidia-driver-pinning-580"
STAGES = ["preflight", "watchdog", "stack", "gpu_verify", "fetch_code", "setup", "run", "artifacts", "done"]


def artifact_names(vm: Vm, dest: Path) -> set[str]:
    out = vm.channel.download_artifacts(vm.run_id, 0, dest)
    assert out is not None and not out.warnings
    return {str(p.relative_to(out.dest)) for p in out.dest.rglob("*") if p.is_file()}


# ---- whole local runs ---------------------------------------------------------------------------


def test_local_run_succeeds_with_log_and_artifacts(tmp_path: Path) -> None:
    run = (
        'echo start; cat hello.txt; echo "rank=$GPUCLOUD_NODE_RANK nodes=$GPUCLOUD_NUM_NODES '
        'gpus=$GPUCLOUD_NUM_GPUS_PER_NODE run=$GPUCLOUD_RUN_ID"; mkdir -p outputs; echo 0.93 > outputs/acc.txt; '
        "for i in 1 2 3; do echo line$i; echo err$i >&2; done; echo end"
    )
    vm = make_vm(
        tmp_path, run=run, setup="echo setting up > setup.txt", artifacts=["outputs/", "setup.txt", "nope.bin"]
    )
    vm.run()
    assert vm.rc == 0, vm.stderr
    status = vm.status()
    assert status["state"] == "succeeded" and status["exit_code"] == 0 and status["stage"] == "done"
    assert status["run_id"] == vm.run_id and status["rank"] == 0
    assert list(status["stages"]) == STAGES
    for name, st in status["stages"].items():
        assert st["ok"] is True, name
        assert st["start"] <= st["end"] <= status["heartbeat"]
    assert status["log_parts"] >= 1
    assert vm.job_output() == (
        f"start\nhello from the workdir\nrank=0 nodes=1 gpus=0 run={vm.run_id}\n"
        "line1\nerr1\nline2\nerr2\nline3\nerr3\nend\n"
    )
    log = vm.log()
    assert "[gpucloud] artifact nope.bin not found (skipped)" in log
    assert "[gpucloud] stage stack" in log and "stack install skipped" in log
    assert artifact_names(vm, tmp_path / "art") == {"outputs/acc.txt", "setup.txt"}
    assert (tmp_path / "art/outputs/acc.txt").read_text() == "0.93\n"


def test_nothing_is_left_running_after_a_run(tmp_path: Path) -> None:
    """Helpers (log pump, watchdog) end with the script; a background child the job left behind is
    killed with the job's process group."""
    marker = f"gpucloud_marker_{uuid.uuid4().hex}"
    vm = make_vm(tmp_path, run=f"bash -c 'sleep 30 # {marker}' & echo spawned").run()
    assert vm.rc == 0
    assert vm.job_output() == "spawned\n"
    end = time.monotonic() + 5  # helpers still exiting on a loaded machine are not "left running"
    while subprocess.run(["pgrep", "-g", str(vm.proc.pid)], capture_output=True).stdout and time.monotonic() < end:
        time.sleep(0.1)
    assert subprocess.run(["pgrep", "-g", str(vm.proc.pid)], capture_output=True, text=True).stdout == ""
    assert _marker_pids(marker) == []


def test_a_background_child_that_ignores_sigterm_is_killed_before_the_run_ends(tmp_path: Path) -> None:
    """The step's leftovers are waited for: one that ignores SIGTERM gets SIGKILL after the grace,
    and the node reports its end only once nothing of the job runs."""
    marker = f"gpucloud_marker_{uuid.uuid4().hex}"
    # The child says when its trap is set (a SIGTERM before that would simply end it); a command
    # after `sleep` keeps bash from exec-ing it, so the marker stays on the waiting shell.
    child = f"bash -c 'trap \"\" TERM; touch trapped; sleep 60; echo {marker}' &"
    vm = make_vm(tmp_path, run=f"{child} until [ -e trapped ]; do sleep 0.05; done; echo spawned").run()
    assert vm.rc == 0 and vm.job_output() == "spawned\n"
    assert _marker_pids(marker) == []
    assert "a background process of the step ignored SIGTERM for 5 s: SIGKILL" in vm.log()


def test_local_run_exit_code_is_the_jobs(tmp_path: Path) -> None:
    vm = make_vm(tmp_path, run="echo failing; exit 3").run()
    assert vm.rc == 3
    status = vm.status()
    assert status["state"] == "failed" and status["exit_code"] == 3
    assert status["stages"]["run"]["ok"] is False
    assert "job exited with code 3" in status["message"]
    assert vm.job_output() == "failing\n"


def test_failing_setup_skips_run(tmp_path: Path) -> None:
    vm = make_vm(tmp_path, setup="echo broken; exit 7", run="touch ran").run()
    status = vm.status()
    assert vm.rc == 7 and status["state"] == "failed" and status["exit_code"] == 7
    assert status["stages"]["setup"]["ok"] is False and "run" not in status["stages"]
    assert "setup exited with code 7" in status["message"]
    assert not (vm.vm_dir / "job" / "ran").exists()


def _marker_pids(marker: str) -> list[str]:
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return out.stdout.split()


def _own_session(marker: str, bootstrap_pid: int) -> bool:
    """Whether a process of the job (found by its marker) runs in a session other than the bootstrap's."""
    for pid in _marker_pids(marker):
        try:
            if os.getsid(int(pid)) != os.getsid(bootstrap_pid):
                return True
        except ProcessLookupError:
            continue
    return False


def test_deadline_kills_the_job_and_reports(tmp_path: Path) -> None:
    """The deadline comes once the job runs (measured from the job's start, not from the launch: a
    loaded machine may take seconds to boot): the node's recorded deadline (st/deadline, which the
    watchdog re-reads) is lowered to now once the job printed, and ends a job that would sleep far
    longer than the wait allows."""
    marker = f"gpucloud_marker_{uuid.uuid4().hex}"
    vm = make_vm(tmp_path, run=f"echo started; sleep 300 # {marker}\n: {marker}").start()
    job_log = vm.vm_dir / "job.log"
    assert wait_until(lambda: job_log.exists() and "started\n" in job_log.read_text(), 30), vm.log()
    lowered = vm.vm_dir / "st" / "deadline.new"
    lowered.write_text(f"{int(time.time())}\n")
    lowered.replace(vm.vm_dir / "st" / "deadline")
    vm.wait(timeout=30)  # the job alone would take 300 s
    assert vm.rc == 124, vm.stderr
    status = vm.status()
    assert status["state"] == "deadline" and status["exit_code"] is None
    assert "max_duration passed" in status["message"]
    assert status["stages"]["run"]["ok"] is False and status["stages"]["done"]["ok"] is True
    assert "started\n" in vm.job_output()
    assert "max_duration passed: stopping the job" in vm.log()
    # The job obeyed SIGTERM: its zombie (which only the main process may reap) is not a job that
    # ignored it, so no SIGKILL after the grace.
    assert "ignored SIGTERM" not in vm.log()
    assert _marker_pids(marker) == []  # the watchdog waited for the job's group to end


def test_heartbeats_and_streaming_log(tmp_path: Path) -> None:
    vm = make_vm(tmp_path, run="echo first-line; sleep 2.5; echo last-line").start()
    beats, streamed = set(), False
    end = time.monotonic() + 15
    while vm.proc.poll() is None and time.monotonic() < end:
        status = vm.channel.read_status(vm.run_id, 0)
        if status and status["state"] == "running":
            beats.add(status["heartbeat"])
            if "first-line" in vm.log():
                streamed = True
        time.sleep(0.1)
    vm.wait()
    assert vm.rc == 0
    assert len(beats) >= 2, beats  # re-PUT while the job runs
    assert streamed, "the first line must be uploaded while the job is still running"
    assert vm.job_output() == "first-line\nlast-line\n"


def test_sigterm_kills_job_and_reports(tmp_path: Path) -> None:
    marker = f"gpucloud_marker_{uuid.uuid4().hex}"
    vm = make_vm(tmp_path, run=f"sleep 30 # {marker}\n: {marker}").start()
    end = time.monotonic() + 10
    while not (vm.vm_dir / "job.pgid").exists() and time.monotonic() < end:
        time.sleep(0.05)
    time.sleep(0.2)
    os.kill(vm.proc.pid, signal.SIGTERM)
    vm.wait(timeout=20)
    assert vm.rc == 143
    status = vm.status()
    assert status["state"] == "failed" and "signal" in status["message"]
    time.sleep(0.3)
    assert _marker_pids(marker) == []


def test_env_values_reach_the_job_byte_for_byte(tmp_path: Path) -> None:
    keys = sorted(NASTY)
    run = "mkdir -p out; for k in " + " ".join(keys) + '; do printf %s "${!k}" > "out/$k"; done'
    vm = make_vm(tmp_path, run=run, env=NASTY, artifacts=["out/"]).run()
    assert vm.rc == 0, vm.stderr
    artifact_names(vm, tmp_path / "art")
    for key in keys:
        assert (tmp_path / "art" / "out" / key).read_bytes() == NASTY[key].encode(), key
    assert not list(tmp_path.rglob("pwned"))


def test_many_log_parts_concatenate_exactly(tmp_path: Path) -> None:
    run = "for i in $(seq 1 40); do printf 'row %03d\\n' $i; sleep 0.02; done; printf 'no newline at end'"
    vm = make_vm(tmp_path, run=run).run()
    assert vm.rc == 0
    expected = "".join(f"row {i:03d}\n" for i in range(1, 41)) + "no newline at end"
    assert vm.job_output().replace("no newline at end[gpucloud]", "no newline at end\n[gpucloud]").startswith(expected)
    assert vm.status()["log_parts"] >= 3


def test_local_gpu_warn_mode_runs_on_cpu(tmp_path: Path) -> None:
    vm = make_vm(tmp_path, gpu="K80", stack=K80, run="echo cpu-run", stub_env={"STUB_GPU_COUNT": "0"}).run()
    assert vm.rc == 0, vm.stderr
    assert vm.status()["state"] == "succeeded"
    assert "WARNING: no NVIDIA GPU on this host (expected 1 x K80): the job runs on the CPU" in vm.log()
    assert not vm.apt_installs()


# ---- stack install with stubs ---------------------------------------------------------------------


def test_k80_stack_install_then_idempotent(tmp_path: Path) -> None:
    stub = {"STUB_GPU_NAME": "Tesla K80", "STUB_GPU_COUNT": "1"}
    vm = make_vm(tmp_path / "a", provider="aws", stack=K80, gpu="K80", run="echo trained", stub_env=stub).run()
    assert vm.rc == 0, vm.stderr
    status = vm.status()
    assert status["state"] == "succeeded", status
    calls = vm.calls()
    assert any(c.startswith("dpkg -i ") and c.endswith("cuda-keyring.deb") for c in calls)
    installs = vm.apt_installs()
    assert installs == [HEADERS, APT + "cuda-drivers-470", APT + "cuda-toolkit-11-4 libcudnn8=8.2.4.*-1+cuda11.4"]
    assert calls.count("apt-get -o DPkg::Lock::Timeout=600 -o Acquire::Retries=3 update") == 1
    pips = [c for c in calls if c.startswith("python3 -m pip install")]
    assert pips == ["python3 -m pip install --no-input torch==2.0.1 --index-url https://download.pytorch.org/whl/cu117"]
    assert "PyTorch sees 1 GPU(s)" in vm.log()
    assert calls[-1] == "shutdown -h now"  # aws: the instance terminates itself

    # second boot on the same machine: everything is there, nothing is installed again
    (vm.state / "calls").unlink()
    again = make_vm(
        tmp_path / "b", provider="aws", stack=K80, gpu="K80", run="echo again", stub_env=stub, state=vm.state
    ).run()
    assert again.rc == 0 and again.status()["state"] == "succeeded"
    calls = again.calls()
    assert again.apt_installs() == [] and not any(c.startswith("apt-get") for c in calls)
    assert not any("pip install" in c for c in calls) and not any(c.startswith("dpkg -i") for c in calls)
    assert "already present" in again.log() and "pytorch 2.0.1+stub already installed" in again.log()


def test_already_installed_packages_skip_apt(tmp_path: Path) -> None:
    """nvidia-smi reports another branch (so the fast path is not taken), but dpkg says every pinned
    package is installed at the pinned version: still no keyring, no apt-get at all."""
    state = tmp_path / "state"
    (state / "pkgs").mkdir(parents=True)
    for name, ver in {
        "cuda-drivers-470": "470.82.01-1",
        "cuda-toolkit-11-4": "11.4.4-1",
        "libcudnn8": "8.2.4.15-1+cuda11.4",
        "cuda-keyring": "1.1-1",
    }.items():
        (state / "pkgs" / name).write_text(ver)
    (state / "py").mkdir()
    (state / "py" / "torch").write_text("2.0.1+cu117")
    vm = make_vm(tmp_path, provider="aws", stack=K80, gpu="K80", state=state, stub_env={"STUB_DRIVER": "535.1.1"}).run()
    assert vm.status()["state"] == "succeeded", vm.status()
    assert not any(c.startswith(("apt-get", "dpkg -i")) or "pip install" in c for c in vm.calls())
    assert vm.apt_installs() == [] and "modprobe nvidia" in vm.calls()


def test_wrong_cudnn_version_is_reinstalled(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "pkgs").mkdir(parents=True)
    (state / "pkgs" / "libcudnn8").write_text("8.9.7.29-1+cuda12.2")
    (state / "pkgs" / "cuda-keyring").write_text("1.1-1")
    vm = make_vm(tmp_path, provider="aws", stack=K80, gpu="K80", state=state, stub_env={}).run()
    assert vm.apt_installs() == [
        HEADERS,
        APT + "cuda-drivers-470",
        APT + "cuda-toolkit-11-4 libcudnn8=8.2.4.*-1+cuda11.4",
    ]
    assert not any(c.startswith("dpkg -i") for c in vm.calls())  # keyring already there


class _FakeAzure(BaseHTTPRequestHandler):
    """IMDS (token + compute metadata) and ARM in one tiny server; records every request."""

    requests: list[tuple[str, str, dict[str, str]]] = []

    def _reply(self, code: int, doc: dict) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        self.requests.append(("GET", self.path, dict(self.headers)))
        if self.headers.get("Metadata") != "true":
            self._reply(400, {"error": "Metadata header required"})
        elif self.path.startswith(
            "/metadata/identity/oauth2/token?api-version=2018-02-01&resource=https://management.azure.com/"
        ):
            self._reply(200, {"access_token": "tok-123", "token_type": "Bearer"})
        elif self.path.startswith("/metadata/instance/compute?"):
            self._reply(200, {"subscriptionId": "sub-1", "resourceGroupName": "gpucloud-run-rg", "name": "vm0"})
        else:
            self._reply(404, {})

    def do_DELETE(self) -> None:  # noqa: N802
        self.requests.append(("DELETE", self.path, dict(self.headers)))
        self._reply(202, {})

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_azure() -> Iterator[tuple[str, list]]:
    _FakeAzure.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeAzure)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _FakeAzure.requests
    server.shutdown()


def test_t4_stack_on_azure_installs_current_packages_and_deletes_its_group(tmp_path: Path, fake_azure) -> None:
    url, requests = fake_azure
    vm = make_vm(
        tmp_path,
        provider="azure",
        stack=T4,
        gpu="T4",
        stub_env={"STUB_GPU_NAME": "Tesla T4", "GPUCLOUD_IMDS_ENDPOINT": url, "GPUCLOUD_AZURE_ARM_ENDPOINT": url},
    ).run()
    assert vm.status()["state"] == "succeeded", vm.status()
    # the T4 stack does not ask for the system toolkit: the PyTorch wheel needs only the driver
    assert vm.apt_installs() == [LOCK_580, APT + "cuda-drivers-580"]
    assert any(c.startswith("python3 -m pip install --no-input torch==2.7.1 ") for c in vm.calls())
    deletes = [r for r in requests if r[0] == "DELETE"]
    assert [d[1] for d in deletes] == ["/subscriptions/sub-1/resourcegroups/gpucloud-run-rg?api-version=2021-04-01"]
    assert deletes[0][2]["Authorization"] == "Bearer tok-123"
    assert vm.calls()[-1] == "shutdown -h now"  # fallback after the delete


def test_framework_not_seeing_gpus_is_an_error(tmp_path: Path) -> None:
    vm = make_vm(
        tmp_path,
        provider="aws",
        stack=K80,
        gpu="K80",
        run="touch trained",
        stub_env={"STUB_GPU_NAME": "Tesla K80", "STUB_FW_GPUS": "0"},
    ).run()
    status = vm.status()
    assert status["state"] == "error" and status["exit_code"] is None
    assert status["message"].startswith("PyTorch sees 0 GPUs, expected 1: driver/wheel mismatch")
    assert "refusing to train on the CPU" in status["message"]
    assert status["stages"]["gpu_verify"]["ok"] is False and "run" not in status["stages"]
    assert not (vm.vm_dir / "job" / "trained").exists()
    assert vm.rc == 1 and vm.calls()[-1] == "shutdown -h now"


def test_apt_failure_is_an_error_with_log_tail(tmp_path: Path) -> None:
    vm = make_vm(tmp_path, provider="aws", stack=K80, gpu="K80", stub_env={"STUB_APT_FAIL": "1"}).run()
    status = vm.status()
    assert status["state"] == "error" and "stack install failed" in status["message"]
    assert status["stages"]["stack"]["ok"] is False


@pytest.mark.parametrize(
    ("model", "count", "smi_name", "smi_count", "ok"),
    [
        ("A100-80GB", 8, "NVIDIA A100-SXM4-80GB", 8, True),
        ("A10G", 1, "NVIDIA A10G", 1, True),
        ("A10", 1, "NVIDIA A10G", 1, False),
        ("K80", 2, "Tesla K80", 1, False),
    ],
)
def test_gpu_verify_strict(tmp_path: Path, model: str, count: int, smi_name: str, smi_count: int, ok: bool) -> None:
    stack = Stack(
        gpu=model,
        architecture="x",
        compute_capability="",
        driver="580",
        cuda="12.8",
        cudnn="9",
        os_image="ubuntu-22.04",
        framework="none",
        framework_version=None,
        ubuntu_version="22.04",
        cuda_repo="ubuntu2204",
        driver_packages=(),
        cuda_packages=(),
        cudnn_packages=(),
        framework_pip=(),
        min_driver_version="",
    )
    vm = make_vm(
        tmp_path,
        provider="aws",
        stack=stack,
        gpu=model,
        count=count,
        stub_env={"STUB_DRIVER": "580.65.06", "STUB_GPU_NAME": smi_name, "STUB_GPU_COUNT": str(smi_count)},
    ).run()
    status = vm.status()
    if ok:
        assert status["state"] == "succeeded", status
    else:
        assert status["state"] == "error"
        assert status["message"].startswith(
            f"GPU check failed: nvidia-smi shows 0 x {model}, expected {count}"
            if model == "A10"
            else f"GPU check failed: nvidia-smi shows 1 x {model}"
        )


def test_status_json_is_valid_json_throughout(tmp_path: Path) -> None:
    vm = make_vm(tmp_path, run="echo 'quote \" and \\\\ backslash'; exit 1").run()
    raw = vm.channel.get_bytes(f"runs/{vm.run_id}/node-0/status.json")
    doc = json.loads(raw)
    assert doc["state"] == "failed"
    assert set(doc) == {
        "run_id",
        "rank",
        "state",
        "stage",
        "stages",
        "heartbeat",
        "exit_code",
        "message",
        "log_parts",
        "log_bytes",
        "artifacts_sha256",
        "sig",
    }  # a final status is signed (channel_trust.py)


def test_artifact_tarball_contents(tmp_path: Path) -> None:
    vm = make_vm(
        tmp_path,
        run="mkdir -p 'out dir'; echo a > 'out dir/a b.txt'; echo m > metrics.json",
        artifacts=["out dir/", "metrics.json"],
    ).run()
    raw = vm.channel.get_bytes(f"runs/{vm.run_id}/node-0/artifacts.tar.gz")
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        names = set(tar.getnames())
    assert {"out dir/a b.txt", "metrics.json"} <= names


# ---- each rendered "done when" script runs to the job's first line -----------------------

DLAMI = {"STUB_DRIVER": "595.91.07", "STUB_PREINSTALLED": "cuda-keyring=1.1-1 nvidia-fabricmanager-595=595.91.07-1"}


def boot_node(
    tmp: Path,
    gpu: str,
    count: int,
    cloud: str,
    instance: str,
    stub_env: dict[str, str],
    *,
    framework: str = "pytorch",
    job_image: str = "auto",
    state: Path | None = None,
    azure_endpoint: str | None = None,
) -> Vm:
    """Resolve the real stack and image for the instance, render, and run it with the stubs.
    `azure_endpoint`: the IMDS and ARM an Azure guest deletes its own group through (fake_azure),
    as on Azure; against a dead IMDS its self-delete would retry for about 27 s before the
    shutdown fallback, time no test here is about."""
    from gpucloud.plan.images import resolve_node
    from gpucloud.plan.stacks import resolve_stack
    from gpucloud.spec.load import StackSpec
    from tests.support.vm_sim import GPU_NAMES

    stack = resolve_stack(gpu, StackSpec(framework=framework))
    node = resolve_node(stack, cloud, instance, count, job_image=job_image)
    env = {"STUB_GPU_NAME": GPU_NAMES[gpu], "STUB_GPU_COUNT": str(count), **stub_env}
    provider = cloud
    vm = make_vm(
        tmp,
        provider=provider,
        stack=stack,
        gpu=gpu,
        count=count,
        run="echo first-line-of-the-job",
        stub_env=env,
        state=state,
        render_kw={"node": node},
    )
    if provider == "azure":
        assert azure_endpoint, "an Azure guest needs its IMDS and ARM (the fake_azure fixture)"
        vm.env["GPUCLOUD_IMDS_ENDPOINT"] = vm.env["GPUCLOUD_AZURE_ARM_ENDPOINT"] = azure_endpoint
    return vm.run(timeout=60)


def _reached_the_job(vm: Vm) -> None:
    assert vm.job_output().startswith("first-line-of-the-job\n"), (vm.log(), vm.stderr)


def test_sim_t4_on_the_vendor_image_installs_no_apt_package(tmp_path: Path) -> None:
    from tests.support.vm_sim import install_calls, stub_counts

    vm = boot_node(tmp_path, "T4", 1, "aws", "g4dn.xlarge", DLAMI)
    _reached_the_job(vm)
    assert vm.apt_installs() == [] and "driver 595.91.07 already present" in vm.log()
    assert install_calls(vm.calls()) == [
        "python3 -m pip install --no-input torch==2.8.0 --index-url https://download.pytorch.org/whl/cu128"
    ]
    assert "apt-get" not in stub_counts(vm.state)


def test_sim_p4d_fabric_manager_on_plain_ubuntu_is_pinned_to_the_installed_driver(tmp_path: Path) -> None:
    vm = boot_node(tmp_path / "plain", "A100-40GB", 8, "aws", "p4d.24xlarge", {}, job_image="ami-0123456789abcdef0")
    _reached_the_job(vm)
    assert vm.apt_installs() == [LOCK_580, APT + "cuda-drivers-580", APT + "nvidia-fabricmanager-580=580.105.08-*"]
    assert "systemctl enable --now nvidia-fabricmanager" in vm.calls()
    vendor = boot_node(tmp_path / "dlami", "A100-40GB", 8, "aws", "p4d.24xlarge", DLAMI)
    _reached_the_job(vendor)
    assert vendor.apt_installs() == [] and "systemctl enable --now nvidia-fabricmanager" in vendor.calls()


def test_sim_azure_a10_waits_for_the_grid_driver(tmp_path: Path, fake_azure: tuple[str, list]) -> None:
    url, _ = fake_azure
    a10 = ("A10", 1, "azure", "Standard_NV36ads_A10_v5")
    vm = boot_node(tmp_path / "ok", *a10, {"STUB_DRIVER": "550.144.06"}, azure_endpoint=url)
    _reached_the_job(vm)
    assert vm.apt_installs() == [] and "waiting for the GRID driver" in vm.log()
    none = boot_node(tmp_path / "none", *a10, {"GPUCLOUD_GRID_WAIT_S": "1"}, azure_endpoint=url)
    assert none.status()["state"] == "error" and "no GRID driver after 1s" in none.log()
    assert none.apt_installs() == []  # never cuda-drivers on a GRID VM


def test_sim_b200_installs_the_open_modules_and_fabric_manager(tmp_path: Path) -> None:
    vm = boot_node(tmp_path, "B200", 8, "aws", "p6-b200.48xlarge", {}, job_image="ami-0123456789abcdef0")
    _reached_the_job(vm)
    assert vm.apt_installs() == [LOCK_580, APT + "nvidia-open-580", APT + "nvidia-fabricmanager-580=580.105.08-*"]


def test_sim_k80_gets_r470_and_pytorch_212_then_a_baked_image_installs_nothing(tmp_path: Path) -> None:
    from tests.support.vm_sim import install_calls

    vm = boot_node(tmp_path / "a", "K80", 1, "aws", "p2.xlarge", {})
    _reached_the_job(vm)
    assert vm.apt_installs() == [HEADERS, APT + "cuda-drivers-470"]
    assert any("keyring" in c and c.startswith("dpkg -i") for c in vm.calls())
    assert [c for c in vm.calls() if "pip install" in c] == [
        "python3 -m pip install --no-input torch==2.1.2 --index-url https://download.pytorch.org/whl/cu118"
    ]
    # The same disk booted again (what a baked image is): the stack stage installs nothing.
    (vm.state / "calls").unlink()
    again = boot_node(tmp_path / "b", "K80", 1, "aws", "p2.xlarge", {}, state=vm.state)
    _reached_the_job(again)
    assert install_calls(again.calls()) == [] and not any(c.startswith("dpkg -i") for c in again.calls())


def test_sim_baked_image_run_installs_nothing(tmp_path: Path) -> None:
    """`image build` then `run`: the builder's disk (stub state) is the baked image; the run on it,
    with the plan pointing at the baked row, counts 0 apt-get and 0 pip installs."""
    from gpucloud.contract.provider import BakedImage
    from gpucloud.plan.baked import baked_row, stack_hash
    from gpucloud.plan.images import resolve_node
    from gpucloud.plan.stacks import resolve_stack
    from gpucloud.spec.load import StackSpec
    from tests.support.vm_sim import install_calls

    builder = boot_node(tmp_path / "builder", "T4", 1, "aws", "g4dn.xlarge", {}, job_image="ami-0123456789abcdef0")
    _reached_the_job(builder)
    assert install_calls(builder.calls())  # the builder installed the stack
    stack = resolve_stack("T4", StackSpec(framework="pytorch"))
    plain = resolve_node(stack, "aws", "g4dn.xlarge", 1)
    baked = baked_row(
        BakedImage(
            ref="ami-0baked000000000000", region="us-east-1", name="gpucloud-x", stack_hash=stack_hash(stack, plain)
        ),
        stack,
        plain,
    )
    node = resolve_node(stack, "aws", "g4dn.xlarge", 1, baked=baked)
    assert node.image is baked
    (builder.state / "calls").unlink()
    run = make_vm(
        tmp_path / "run",
        provider="aws",
        stack=stack,
        gpu="T4",
        run="echo first-line-of-the-job",
        stub_env={"STUB_GPU_NAME": "Tesla T4"},
        state=builder.state,
        render_kw={"node": node},
    ).run(timeout=60)
    _reached_the_job(run)
    assert install_calls(run.calls()) == [] and not any(c.startswith("dpkg -i") for c in run.calls())


# ---- layer (a): the backstop is armed before anything else -------------------------------


def test_backstop_is_a_systemd_timer_on_clouds_and_shutdown_without_systemd(tmp_path: Path) -> None:
    stub = {"STUB_GPU_NAME": "Tesla K80", "GPUCLOUD_DEADLINE_GRACE": "7"}
    vm = make_vm(tmp_path / "a", provider="aws", stack=K80, gpu="K80", max_duration=600, stub_env=stub).run()
    assert vm.status()["state"] == "succeeded"
    calls = vm.calls()
    timer = calls[0]  # before apt, nvidia-smi or anything else
    assert timer.startswith("systemd-run --quiet --unit=gpucloud-backstop-") and "--on-active=607s" in timer
    assert timer.endswith(f"{vm.script} backstop 0 {vm.proc.pid} {vm.vm_dir}")
    vm = make_vm(
        tmp_path / "b",
        provider="aws",
        stack=K80,
        gpu="K80",
        max_duration=600,
        stub_env={**stub, "STUB_NO_SYSTEMD": "1"},
    ).run()
    assert vm.calls()[1] == "shutdown -P +11"  # 607 s, rounded up to minutes
    assert vm.calls()[-1] == "shutdown -h now"


def test_local_backstop_is_disarmed_when_the_run_ends(tmp_path: Path) -> None:
    vm = make_vm(tmp_path, run="echo hi", stub_env={"GPUCLOUD_VM_SANDBOX": str(tmp_path / "vm")}).run()
    assert vm.rc == 0
    time.sleep(0.3)
    from gpucloud.providers.local.engine import marked_pids

    assert marked_pids(tmp_path / "vm") == []  # the setsid sleeper went with the run


def test_backstop_fires_when_the_bootstrap_is_gone(tmp_path: Path) -> None:
    """SIGKILL the bootstrap and its watchdog: the backstop still ends the job and reports."""
    marker = f"gpucloud_marker_{uuid.uuid4().hex}"
    vm = make_vm(
        tmp_path,
        run=f"sleep 60 # {marker}\n: {marker}",
        max_duration=2,
        stub_env={"GPUCLOUD_DEADLINE_GRACE": "2", "GPUCLOUD_VM_SANDBOX": str(tmp_path / "vm")},
    ).start()
    end = time.monotonic() + 10
    # job.pgid is written as the job's subshell starts, a moment before it setsid's into its own
    # session: wait for the job itself, or the kill below would take it with the bootstrap.
    while not _own_session(marker, vm.proc.pid) and time.monotonic() < end:
        time.sleep(0.05)
    os.killpg(vm.proc.pid, signal.SIGKILL)  # bootstrap, pump and watchdog; the job has its own session
    vm.proc.wait(timeout=5)
    assert _marker_pids(marker), "the job survives its bootstrap"
    end = time.monotonic() + 10
    while _marker_pids(marker) and time.monotonic() < end:
        time.sleep(0.1)
    assert _marker_pids(marker) == []
    end = time.monotonic() + 5  # the backstop reports right after its kill
    while vm.status()["state"] == "running" and time.monotonic() < end:
        time.sleep(0.1)
    status = vm.status()
    assert status["state"] == "deadline" and "backstop" in status["message"]
