"""The VM fault matrix (docs/INTERNALS.md "Deadline layers"): the rendered shim and its agent run
by bash against a FileChannel (behind a misbehaving HTTP server where the fault is the store's),
with one fault each. After every fault the VM must be gone by deadline + grace + a few seconds and
what the channel holds must be the truth (a final state, or nothing when nothing could be sent).

"Gone": on the local provider no process of the VM is left (the sandbox marker, as vm_engine
finds them); on a cloud the guest called `shutdown -h now` (the stub records it; the simulator then
ends the instance). Deadlines are 3 s (60 s where the fault itself ends the run, so that no deadline
comes first) and the backstop's grace 10 s, so the matrix runs in ~1 min.
The deadline is max_duration's, counted from the agent's own start (the manifest's is far off), and
"gone after" is measured from that start too where the agent's work folder shows it: a loaded
machine may take seconds to boot the agent, and a deadline from the launch would end a cell before
its fault. Set GPUCLOUD_FAULT_MATRIX=<file> to get the matrix as a table.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpucloud.providers.local import engine as vm_engine
from tests.support.fault_http import FaultServer, closed_port
from tests.support.render_inputs import K80
from tests.support.vm_boot import Vm, make_vm

DEADLINE_S = 3
GRACE_S = 10
MARGIN_S = 5  # the backstop's kill and the status it pushes
ROWS: list[str] = []


@dataclass
class Cell:
    name: str
    provider: str = "local"
    run: str = "echo started; sleep 60"
    state: str | None = "deadline"  # the final state the channel must hold (None: no status)
    message: str = ""  # a piece of the final message
    server: dict | None = None  # FaultServer options, or {"refuse": "puts"|"manifest"}
    env: dict[str, str] = field(default_factory=dict)
    act: Callable[[Vm], None] | None = None  # what is done to the running VM
    gone_by: float = DEADLINE_S + GRACE_S + MARGIN_S
    # A fault that ends the run itself: no deadline may come first on a loaded machine (the job may
    # start seconds after the agent), and "gone after" counts from the fault, not the agent's start.
    ends_the_run: bool = False


def _wait_for(path: Path, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert path.exists(), path


def _signal_main(sig: int) -> Callable[[Vm], None]:
    def act(vm: Vm) -> None:
        _wait_for(vm.vm_dir / "job.pgid")
        time.sleep(0.2)
        os.kill(vm.proc.pid, sig)

    return act


def _kill_watchdog(vm: Vm) -> None:
    _wait_for(vm.vm_dir / "job.pgid")
    os.kill(int((vm.vm_dir / "st" / "wd_pid").read_text()), signal.SIGKILL)


CELLS = [
    Cell("first PUT hangs", server={"hang_puts": 1}, message="max_duration passed"),
    Cell("every PUT refused", server={"refuse": "puts"}, state=None),
    Cell("manifest unreachable", server={"refuse": "manifest"}, state=None, gone_by=DEADLINE_S + MARGIN_S),
    Cell("watchdog killed", act=_kill_watchdog, message="stopped by the backstop"),
    Cell("watchdog killed (aws)", provider="aws", act=_kill_watchdog, message="stopped by the backstop"),
    Cell(
        "main SIGTERM",
        act=_signal_main(signal.SIGTERM),
        state="failed",
        message="signal",
        gone_by=MARGIN_S,
        ends_the_run=True,
    ),
    Cell("main SIGKILL", act=_signal_main(signal.SIGKILL), message="max_duration passed"),
    Cell(
        "main SIGKILL (aws)",
        provider="aws",
        act=_signal_main(signal.SIGKILL),
        message="max_duration passed",
        gone_by=DEADLINE_S + MARGIN_S,
    ),
    Cell(
        "work dir not creatable",
        provider="aws",
        state="error",
        message="cannot create the work folder",
        env={"GPUCLOUD_VM_DIR": "/dev/null/gpucloud"},
        gone_by=MARGIN_S,
    ),
    Cell(
        "disk full",
        run="echo data >/dev/full",
        state="failed",
        message="disk was full",
        env={"STUB_DISK_FULL": "1"},
        gone_by=MARGIN_S,
    ),
    Cell(
        "apt failing",
        provider="aws",
        state="error",
        message="stack install failed",
        env={"STUB_APT_FAIL": "1"},
        gone_by=MARGIN_S,
    ),
    Cell(
        "job ignores SIGTERM",
        run="trap '' TERM; echo started; sleep 60; sleep 60",
        message="max_duration passed",
        gone_by=DEADLINE_S + 5 + MARGIN_S,
    ),
]


@pytest.fixture(scope="module", autouse=True)
def matrix_table() -> Iterator[None]:
    yield
    out = os.environ.get("GPUCLOUD_FAULT_MATRIX")
    if out and ROWS:
        head = (
            "| fault | provider | reported state | VM gone after (s) | limit (s) | VMs left |\n"
            "|---|---|---|---|---|---|\n"
        )
        Path(out).write_text(head + "\n".join(ROWS) + "\n")


def _gone(vm: Vm, provider: str) -> bool:
    if provider == "local":
        return not vm_engine.marked_pids(vm.vm_dir) and vm.proc.poll() is not None
    return any(c == "shutdown -h now" for c in vm.calls())


def _origin(vm: Vm, launched: float) -> float:
    """When the agent started (its st/t0, written first thing), where its deadline counts from;
    the launch where the agent never got its work folder."""
    try:
        return max(launched, (vm.vm_dir / "st" / "t0").stat().st_mtime)
    except OSError:
        return launched


def _url_map(cell: Cell, server: FaultServer) -> Callable[[str], str]:
    refused = f"http://127.0.0.1:{closed_port()}"
    refuse = (cell.server or {}).get("refuse")

    def url_map(url: str) -> str:
        mapped = server.url_map(url)
        path = mapped[len(server.base) :]
        if refuse == "manifest" and path.endswith("/manifest"):
            return refused + path
        if (
            refuse == "puts"
            and not path.endswith(("/manifest", "/code.tar.gz", "/agent.tar.gz"))
            and "/ready" not in path
        ):
            return refused + path
        return mapped

    return url_map


@pytest.mark.parametrize("cell", CELLS, ids=[c.name for c in CELLS])
def test_fault_leaves_no_vm_and_reports_the_truth(tmp_path: Path, cell: Cell) -> None:
    server = None
    kw: dict = {}
    if cell.server is not None:
        server = FaultServer(tmp_path / "channel", **{k: v for k, v in cell.server.items() if k != "refuse"}).start()
        kw["url_map"] = _url_map(cell, server)
    aws = cell.provider == "aws"
    env = {
        "GPUCLOUD_DEADLINE_GRACE": str(GRACE_S),
        "GPUCLOUD_VM_SANDBOX": str(tmp_path / "vm"),
        "TMPDIR": str(tmp_path),
        **cell.env,
    }
    if aws:
        kw.update(stack=K80, gpu="K80")
        env["STUB_GPU_NAME"] = "Tesla K80"
        env.setdefault("STUB_APT_REPO", "")  # the plain apt stub: the job must start within the 3 s deadline
    vm = make_vm(
        tmp_path,
        provider=cell.provider,
        run=cell.run,
        deadline_s=600,
        max_duration=DEADLINE_S * 20 if cell.ends_the_run else DEADLINE_S,
        stub_env=env,
        **kw,
    )
    t0 = time.time()
    vm.start()
    acted: float | None = None

    def since() -> float:
        """Where "gone after" counts from: the fault that ends the run, else the agent's start."""
        return acted if acted is not None else _origin(vm, t0)

    try:
        if cell.act is not None:
            cell.act(vm)
            acted = time.time() if cell.ends_the_run else None
        while not _gone(vm, cell.provider) and time.time() - since() < cell.gone_by + 20:
            time.sleep(0.1)
        gone_after = time.time() - since()
        gone = _gone(vm, cell.provider)
    finally:
        if aws:  # the cloud ends the instance after its shutdown: every process of it goes
            vm_engine.BootedVm(sandbox=vm.vm_dir, pid=vm.proc.pid, start_time=None, booted_at=0).kill(grace=1)
        if vm.proc.poll() is None:
            os.killpg(vm.proc.pid, signal.SIGKILL)
        vm.proc.wait(timeout=10)
        vm.end_timers()
        if server is not None:
            server.stop()
    status = vm.channel.read_status(vm.run_id, 0)
    state = status["state"] if status else None
    left = len(vm_engine.marked_pids(vm.vm_dir)) if not aws else 0
    ROWS.append(
        f"| {cell.name} | {cell.provider} | {state or 'no status (none could be sent)'} | "
        f"{gone_after:.1f} | {cell.gone_by} | {0 if gone and not left else 1} |"
    )
    assert gone, f"{cell.name}: VM still there after {gone_after:.1f}s"
    assert gone_after <= cell.gone_by, f"{cell.name}: gone only after {gone_after:.1f}s"
    assert left == 0
    assert state == cell.state, (status, vm.console() if hasattr(vm, "console") else "")
    if cell.state is not None:
        assert cell.message in status["message"], status
        assert status["stage"] == "done"
