"""A node's real bootstrap run on this machine, its system commands stubbed (tests/support/vm_stubs):
the rendered user-data against a file channel, and what the node did (status, log, the commands it ran)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpucloud.channel.run_objects import FileChannel, iter_manifest, pack_workdir
from gpucloud.contract.registry import capabilities
from gpucloud.plan.stacks import Stack
from gpucloud.vm.agent_config import job_config
from gpucloud.vm.agent_pack import agent_archive, archive_sha256
from gpucloud.vm.shim import render_shim
from tests.support.render_inputs import CPU, make_candidate, make_spec

STUBS = Path(__file__).parent / "vm_stubs"
NVIDIA_REPO_INDEX = Path(__file__).parent.parent / "data" / "nvidia_repo_packages.txt"


@dataclass
class Vm:
    """One node's bootstrap: start it, wait for it, then read what it reported and what it ran."""

    tmp: Path
    channel: FileChannel
    run_id: str
    script: Path
    env: dict[str, str]
    vm_dir: Path
    state: Path
    proc: subprocess.Popen[bytes] | None = None
    stderr: str = ""
    rc: int | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def start(self) -> Vm:
        self.proc = subprocess.Popen(
            ["bash", str(self.script)],
            cwd=self.vm_dir,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        return self

    def wait(self, timeout: float = 30) -> Vm:
        assert self.proc is not None
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise
        self.stderr = err.decode(errors="replace")
        self.rc = self.proc.returncode
        self.end_timers()
        return self

    def end_timers(self) -> None:
        """End the backstop timers the systemd-run stub started, and a local backstop sleeper that a
        SIGKILLed bootstrap could not disarm (a real VM's die with it; left here, one would KILL a
        process group number, perhaps someone else's by then, an hour later)."""
        path = self.state / "timers"
        groups = [int(pid) for pid in (path.read_text().split() if path.exists() else [])]
        marker = b" backstop ", str(self.vm_dir).encode()
        for proc in Path("/proc").iterdir():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if proc.name.isdigit() and all(m in cmdline for m in marker):
                groups.append(int(proc.name))
        for pid in groups:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def run(self, timeout: float = 30) -> Vm:
        return self.start().wait(timeout)

    def status(self) -> dict:
        status = self.channel.read_status(self.run_id, 0)
        assert status is not None, self.stderr
        return status

    def log(self) -> str:
        return b"".join(self.channel.read_log_parts(self.run_id, 0, 0)).decode()

    def job_output(self) -> str:
        return "".join(line for line in self.log().splitlines(keepends=True) if not line.startswith("[gpucloud] "))

    def calls(self) -> list[str]:
        path = self.state / "calls"
        return path.read_text().splitlines() if path.exists() else []

    def apt_installs(self) -> list[str]:
        return [c for c in self.calls() if c.startswith("apt-get ") and " install " in f" {c} "]


def make_vm(
    tmp: Path,
    *,
    provider: str = "local",
    stack: Stack = CPU,
    gpu: str = "",
    count: int = 1,
    run: str = "echo hi",
    setup: str | None = None,
    env: dict[str, str] | None = None,
    artifacts: list[str] | None = None,
    deadline_s: float = 120,
    files: dict[str, str] | None = None,
    stub_env: dict[str, str] | None = None,
    state: Path | None = None,
    render_kw: dict | None = None,
    spot: dict | None = None,
    run_id: str | None = None,
    max_duration: int = 3600,
    url_map: Callable[[str], str] | None = None,
    keep_s: int = 0,
) -> Vm:
    """A rendered bootstrap ready to run; url_map rewrites the manifest's URLs (a faulty server);
    `spot`: checkpoint/checkpoint_interval of the job; `run_id`: boot another attempt of that run;
    `keep_s`: the machine is kept that long idle after its job."""
    tmp.mkdir(parents=True, exist_ok=True)
    run_id = run_id or f"r{uuid.uuid4().hex[:8]}"
    channel = FileChannel(tmp / "channel")
    wd = tmp / "workdir"
    wd.mkdir(exist_ok=True)
    for rel, text in (files or {"hello.txt": "hello from the workdir\n"}).items():
        (wd / rel).write_text(text)
    channel.upload_code(run_id, pack_workdir(wd, dest=tmp / "code.tar.gz"))
    channel.reset_nodes(run_id, 1)
    manifest = channel.prepare(
        run_id,
        1,
        datetime.now(UTC) + timedelta(seconds=deadline_s),
        checkpoint=bool((spot or {}).get("checkpoint")),
        agent=True,
    )[0]
    if url_map is not None:
        key = f"runs/{run_id}/node-0/manifest"
        channel.put_bytes(
            key,
            "".join(
                f"{k} {url_map(rest)}\n"
                if k.endswith(("_put", "_get")) and " " not in rest
                else f"{k} {rest.split(' ', 1)[0]} {url_map(rest.split(' ', 1)[1])}\n"
                if " " in rest
                else f"{k} {rest}\n"
                for k, rest in iter_manifest(channel.get_bytes(key).decode())
            ).encode(),
        )
        manifest = url_map(manifest)
    spec = make_spec(
        cloud=provider,
        gpu=gpu or None,
        count=count,
        env=env or {},
        run=run,
        setup=setup,
        artifacts=artifacts or [],
        max_duration=max_duration,
    )
    for key, value in (spot or {}).items():
        setattr(spec, key, value)
    cand = make_candidate(provider, gpu, count if gpu else 0)
    cfg = job_config(
        spec,
        stack,
        cand,
        caps=capabilities(provider),
        run_id=run_id,
        log_interval=0.2,
        heartbeat_interval=0.4,
        **(render_kw or {}),
    )
    cfg.keep_s = keep_s  # a kept machine (docs/KEEP.md): it waits this long idle after its job
    archive = agent_archive(cfg.to_json())
    channel.upload_agent(run_id, archive)
    text = render_shim(
        caps=capabilities(provider),
        run_id=run_id,
        max_duration=max_duration,
        agent_sha256=archive_sha256(archive),
        manifest_url=manifest,
    )
    vm_dir = tmp / "vm"
    if run_id and vm_dir.exists():  # another attempt: a fresh machine
        import shutil

        shutil.rmtree(vm_dir)
    vm_dir.mkdir(exist_ok=True)
    script = vm_dir / "bootstrap.sh"
    script.write_text(text)
    state = state or tmp / "stub-state"
    state.mkdir(exist_ok=True)
    repo = tmp / "nvidia-repo" / stack.cuda_repo / "x86_64"
    repo.mkdir(parents=True, exist_ok=True)
    (repo / "cuda-keyring_1.1-1_all.deb").write_bytes(b"!<arch>\nfake keyring\n")
    base_path = os.environ.get("PATH", "/usr/bin:/bin")
    env = {
        "PATH": f"{STUBS}:{base_path}" if provider != "local" or stub_env is not None else base_path,
        "HOME": str(tmp),
        "LANG": "C.UTF-8",
        "GPUCLOUD_NVIDIA_REPO": (tmp / "nvidia-repo").as_uri(),
        "GPUCLOUD_CUDA_ROOT": str(tmp / "no-cuda-here"),
        "STUB_STATE": str(state),
        "GPUCLOUD_IMDS_ENDPOINT": "http://127.0.0.1:9",  # never the host's metadata service
        "GPUCLOUD_ETC": str(tmp / "etc"),  # apt preferences and systemd units of the "VM", not the host's
        "STUB_APT_REPO": str(NVIDIA_REPO_INDEX),
        "STUB_REAL_PYTHON": sys.executable,
        **(stub_env or {}),
    }
    if provider != "local":
        env.setdefault("GPUCLOUD_VM_DIR", str(vm_dir))
    return Vm(tmp=tmp, channel=channel, run_id=run_id, script=script, env=env, vm_dir=vm_dir, state=state)
