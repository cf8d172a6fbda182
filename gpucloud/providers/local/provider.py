"""The local provider: each node of a run is a bootstrap process on this machine (vm_engine), with a
file:// channel under GPUCLOUD_HOME. It lets a user with no cloud account run a job through the
whole lifecycle, and it is what the lifecycle's end-to-end tests run on."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from gpucloud.contract.provider import (
    Candidate,
    Capabilities,
    FatalProvisionError,
    LaunchRequest,
    Provider,
    RunHandle,
    expiry_tag,
)
from gpucloud.contract.session import SessionAsk, SessionPlan, session_tail
from gpucloud.contract.tags import GcIncomplete
from gpucloud.errors import UserError
from gpucloud.providers.local import engine as vm_engine
from gpucloud.providers.local.interpreter import job_python
from gpucloud.vm.agent.container import remove_recorded
from gpucloud.vm.agent.mounts import unmount_recorded

if TYPE_CHECKING:
    from gpucloud.channel.run_objects import Channel
    from gpucloud.contract.provider import Journal, PlanRequest

REGION = "local"
# How long a stopped node gets before SIGKILL: the bootstrap gives its job 5 s to end on SIGTERM,
# then uploads what the job saved as its artifacts and its final status (a cloud's shutdown waits too).
STOP_GRACE_S = 10.0
INSTANCE = "localhost"


def drop_log_copies(sandbox: Path) -> None:
    """A torn-down node's own log and unsent parts: the channel and the CLI's mirror have the log,
    and on a cloud this copy dies with the VM's disk (one copy kept)."""
    for path in [sandbox / "job.log", *sandbox.glob("part.*")]:
        path.unlink(missing_ok=True)


class LocalProvider(Provider):
    """Provider protocol on this machine. Nodes live in `GPUCLOUD_HOME/local/<run_id>/node-<rank>`."""

    name = "local"
    capabilities = Capabilities(
        poll_interval=0.1,  # seconds between the lifecycle's looks at the channel: files are cheap
        log_interval=0.5,  # a log part every half second: a line shows within ~1 s; parts are free
        heartbeat_interval=2.0,  # a killed local node is noticed within ~3 heartbeats
        barrier_timeout=120.0,  # multi-node: local nodes boot at once; a missing peer is a failed one
        self_termination="exit",  # the node is a process: it ends, it does not shut the host down
        vm_dir="$PWD",  # the sandbox folder vm_engine starts the bootstrap in
        install_stack=False,  # the host's driver and CUDA are used as they are
        gpu_check="warn",  # no GPU here means a warning and a CPU run
        node_ips_known=True,  # every node is on loopback
    )

    def __init__(self, *, home: Path | None = None) -> None:
        from gpucloud.state.runs_db import home_dir

        self.home = Path(home) if home is not None else home_dir()
        self._notes: list[str] = []

    # -- paths --------------------------------------------------------------------------------------

    def run_dir(self, run_id: str) -> Path:
        return self.home / "local" / run_id

    def sandbox(self, run_id: str, rank: int) -> Path:
        return self.run_dir(run_id) / f"node-{rank}"

    def _shim_dir(self, target: str) -> Path:
        """`python`/`python3` wrappers for `target` (the interpreter that has the job's framework,
        interpreter.py), first on the job's PATH, also where its folder has no plain `python`."""
        shim = self.home / "local" / ".bin"
        for name in ("python", "python3"):
            path = shim / name
            text = f'#!/bin/sh\nexec "{target}" "$@"\n'
            try:
                if path.read_text() == text:
                    continue
            except OSError:
                pass
            shim.mkdir(parents=True, exist_ok=True)
            tmp = shim / f".{name}.{time.time_ns()}"
            tmp.write_text(text)
            tmp.chmod(0o755)
            tmp.replace(path)
        return shim

    def master_port(self) -> int:
        """A free TCP port on loopback for the run's MASTER_PORT: every local node publishes
        127.0.0.1, and several runs (or a user's own torchrun) may share loopback, so the fixed
        29500 of the clouds would collide. The kernel picks it; the job binds it moments later."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    # -- Provider protocol --------------------------------------------------------------------------

    def channel(self, region: str) -> Channel:
        from gpucloud.channel.run_objects import FileChannel

        return FileChannel(self.home / "channel")

    def plan_candidates(self, job: PlanRequest) -> list[Candidate]:
        """This machine: one free candidate (the GPU it may or may not have is checked with a warning);
        which python has the job's framework is said before the job starts (plan_notes)."""
        self._notes = [n for n in [job_python(job.framework).note] if n]
        return [
            Candidate(
                cloud=self.name,
                region=REGION,
                instance_type=INSTANCE,
                gpu=job.gpu or "",
                gpu_count=job.gpu_count,
                num_nodes=job.num_nodes,
                spot=False,
                price_per_hour=0.0,
                total_per_hour=0.0,
                estimated_cost=0.0,
            )
        ]

    def plan_notes(self) -> list[str]:
        """Which python the job gets when it is not the PATH's own, or that none has its framework."""
        return list(self._notes)

    def provision(self, req: LaunchRequest, journal: Journal) -> RunHandle:
        """Boot one bootstrap process per node. Intent is journaled before each boot. The nodes get
        the caller's PATH without gpucloud's virtualenv, and the framework's python first (interpreter.py)."""
        handle = RunHandle(run_id=req.run_id, cloud=self.name, region=REGION, attempt=req.attempt)
        ids = handle.nodes
        booted: list[vm_engine.BootedVm] = []
        chosen = job_python(req.framework)
        base_env = {**vm_engine.default_base_env(), "PATH": chosen.path}
        path_prefix = [self._shim_dir(chosen.python)] if chosen.python else []
        expires = req.expires_at.timestamp()
        try:
            for rank, script in enumerate(req.user_data):
                sandbox = self.sandbox(req.run_id, rank)
                res_id = journal.intent(req.run_id, "process", f"{req.run_id}/node-{rank}", REGION, self.name)
                if sandbox.exists():  # a previous attempt of this run: start clean
                    old = vm_engine.BootedVm.load(sandbox)
                    if old is not None:
                        old.kill(grace=1.0)
                    shutil.rmtree(sandbox, ignore_errors=True)
                vm = vm_engine.boot(
                    script,
                    sandbox,
                    env={"GPUCLOUD_NODE_RANK": str(rank)},
                    base_env=base_env,
                    path_prefix=path_prefix,
                    expires_at=expires,
                    meta={"run_id": req.run_id, "rank": str(rank), "res_id": str(res_id)},
                )
                booted.append(vm)
                journal.created(res_id, f"pid:{vm.pid}")
                ids.append(f"pid:{vm.pid}")
                handle.add("process", f"{req.run_id}/node-{rank}")
        except OSError as exc:
            for vm in booted:
                vm.kill(grace=1.0)
            raise FatalProvisionError(f"could not start a local node: {exc}", code="OSError") from exc
        return handle

    def _vms(self, run_id: str) -> list[vm_engine.BootedVm]:
        root = self.run_dir(run_id)
        if not root.is_dir():
            return []
        vms = []
        ranked = [p for p in root.glob("node-*") if p.name[5:].isascii() and p.name[5:].isdigit()]
        for sandbox in sorted(ranked, key=lambda p: int(p.name[5:])):
            vm = vm_engine.BootedVm.load(sandbox)
            if vm is not None:
                vms.append(vm)
        return vms

    def console_hint(self, handle: RunHandle, rank: int) -> str:
        """Where to look when a node died without a word (the lifecycle adds it to the message)."""
        return f"its console output is in {self.sandbox(handle.run_id, rank) / vm_engine.CONSOLE_FILE}"

    def node_states(self, handle: RunHandle) -> list[str]:
        return ["running" if vm.alive() else "gone" for vm in self._vms(handle.run_id)]

    def session_path(self, handle: RunHandle, rank: int, ask: SessionAsk) -> SessionPlan:
        """A shell (or the command) on this machine in the node's environment, read from its live
        bootstrap process, started in the job's folder: what the job itself sees. The node's ports
        are this machine's loopback ports, so nothing is forwarded."""
        vm = next((v for v in self._vms(handle.run_id) if v.sandbox.name == f"node-{rank}"), None)
        if vm is None or not vm.alive():
            raise UserError(
                f"node {rank} of run {handle.run_id} is not running on this machine.",
                hint="`gpucloud status RUN` says how the run ended.",
            )
        env = vm_engine.process_env(vm.pid) or vm_engine.default_base_env()
        folder = vm.sandbox / "job" if (vm.sandbox / "job").is_dir() else vm.sandbox
        env = {**env, "PWD": str(folder), "GPUCLOUD_VM_DIR": str(vm.sandbox)}
        env.setdefault("SHELL", os.environ.get("SHELL") or "bash")
        argv = ["bash", "-c", session_tail(ask)]  # registered in the node's sessions/ while open
        return SessionPlan(argv=argv, cwd=str(folder), env=env, ports_local=True, node_folder=str(folder))

    def teardown(self, handle: RunHandle, journal: Journal, *, wait: bool = True) -> None:
        """Kill every process of the run (whole process groups, then stragglers) and mark its
        resources deleted. The sandbox (console log included, the job's log not) stays for debugging until gc. The
        sandboxes are found by run id, so a partial handle (a crash mid-provision) finds them too."""
        run_id = handle.run_id
        for vm in self._vms(run_id):
            vm.kill(grace=STOP_GRACE_S if wait else 1.0)
            remove_recorded(vm.sandbox)  # a step's container outlives its killed engine client
            unmount_recorded(vm.sandbox)  # an input mount outlives a killed rclone
            drop_log_copies(vm.sandbox)
        for res in journal.resources(run_id, alive_only=True):
            if res.cloud == self.name:
                journal.deleted(res.id)

    def gc(self, now: datetime, *, dry_run: bool) -> list[str]:
        """Kill local nodes whose expiry passed; remove sandboxes of ended runs older than a day
        (remove_tree: no depth limit); GcIncomplete names a sandbox that could not be removed."""
        lines: list[str] = []
        failures: list[str] = []
        ts = now.timestamp()
        root = self.home / "local"
        if not root.is_dir():
            return lines
        for run_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            vms = self._vms(run_dir.name)
            running = [vm for vm in vms if vm.leftovers()]
            for vm in running:
                if vm.expires_at is not None and vm.expires_at < ts:
                    lines.append(
                        f"local: {run_dir.name}/{vm.sandbox.name} process {vm.pid} expired "
                        f"{expiry_tag(datetime.fromtimestamp(vm.expires_at, UTC))}"
                        + (" (would kill)" if dry_run else " (killed)")
                    )
                    if not dry_run:
                        vm.kill()
                        remove_recorded(vm.sandbox)
                        unmount_recorded(vm.sandbox)
            if running or not vms or max(vm.booted_at for vm in vms) >= ts - 86400:
                continue
            head = f"local: {run_dir.name} sandbox of an ended run"
            if dry_run:
                lines.append(f"{head} (would remove)")
                continue
            for vm in vms:
                unmount_recorded(vm.sandbox)  # an input mount a killed rclone left: never walk a bucket
            problems = remove_tree(run_dir)
            lines.append(f"{head} ({'NOT removed: ' + '; '.join(problems) if problems else 'removed'})")
            failures += [f"local: {run_dir.name}: {p}" for p in problems]
        if failures:
            raise GcIncomplete(lines, failures)
        return lines


MAX_PROBLEMS = 5  # what remove_tree names of what it could not remove


def remove_tree(top: Path) -> list[str]:
    """Remove `top` and everything under it without recursion: each folder's sub-folders are first
    moved up to be children of `top` (a rename inside it), so neither the depth, the path length nor
    the open files grow with the tree. Links are removed, never followed; a folder on another
    filesystem (a mount left behind) is left alone. Returns what could not be removed."""
    try:
        root = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [f"{top}: {exc.strerror}"]
    problems: list[str] = []
    try:
        dev = os.fstat(root).st_dev
        todo = _empty_folder(root, root, dev, problems)
        while todo:
            name = todo.pop()
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root)
            except OSError as exc:
                problems.append(f"{name}: {exc.strerror}")
                continue
            try:
                if os.fstat(fd).st_dev != dev:
                    problems.append(f"{name}: another filesystem is mounted there, left alone")
                    continue
                todo += _empty_folder(fd, root, dev, problems)
            finally:
                os.close(fd)
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=root)
    finally:
        os.close(root)
    try:
        os.rmdir(top)
    except OSError as exc:
        problems.append(f"{top}: {exc.strerror}")
    return problems[:MAX_PROBLEMS]


def _empty_folder(fd: int, root: int, dev: int, problems: list[str]) -> list[str]:
    """Unlink the files and links of the folder `fd`; move its sub-folders up under `root` with
    fresh names, returned for the caller to empty in turn."""
    moved: list[str] = []
    with os.scandir(fd) as entries:
        names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
    for name, is_dir in names:
        try:
            if not is_dir:
                os.unlink(name, dir_fd=fd)
            elif os.stat(name, dir_fd=fd, follow_symlinks=False).st_dev != dev:
                problems.append(f"{name}: another filesystem is mounted there, left alone")
            elif fd == root:
                moved.append(name)
            else:
                new = _fresh_name(root)
                os.rename(name, new, src_dir_fd=fd, dst_dir_fd=root)
                moved.append(new)
        except OSError as exc:
            problems.append(f"{name}: {exc.strerror}")
    return moved


def _fresh_name(root: int) -> str:
    """A name not yet taken directly under `root`."""
    while True:
        name = f".gc-{secrets.token_hex(8)}"
        try:
            os.stat(name, dir_fd=root, follow_symlinks=False)
        except FileNotFoundError:
            return name
