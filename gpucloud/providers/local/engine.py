"""A "VM" on this machine: the rendered shim (which starts the agent) run by bash in a sandbox folder.

The local provider boots its nodes with it, and the AWS/Azure simulators of the test harness boot
the fake clouds' instances with it (their stub `nvidia-smi`, `apt-get` and `shutdown` go first on
PATH through `path_prefix`). Each VM runs in its own session and process group, with a marker in
its environment, and its pid is persisted in `<sandbox>/vm.json`, so any CLI process (`down`, `gc`)
can later find and kill everything the VM started, even after the CLI that booted it is gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PID_FILE = "vm.json"
SCRIPT_FILE = "bootstrap.sh"
CONSOLE_FILE = "console.log"
MARKER_ENV = "GPUCLOUD_VM_SANDBOX"

# Variables a local VM keeps from the caller: enough to find tools, GPUs, a temp dir and this
# machine's container engine as it is configured (a job's `container:` runs on it), nothing secret
# (a cloud VM would not see the caller's credentials either).
PASSTHROUGH_ENV = (
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CONTAINERS_CONF",
    "CONTAINERS_STORAGE_CONF",
    "CONTAINERS_REGISTRIES_CONF",
    "DOCKER_HOST",
)
PASSTHROUGH_PREFIXES = ("CUDA_", "NVIDIA_")


def default_base_env() -> dict[str, str]:
    """The caller's environment reduced to what a machine of its own would have."""
    env = {k: v for k, v in os.environ.items() if k in PASSTHROUGH_ENV or k.startswith(PASSTHROUGH_PREFIXES)}
    env["PATH"] = os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin"
    env.setdefault("LANG", "C.UTF-8")
    return env


def process_env(pid: int) -> dict[str, str] | None:
    """A live process's environment (/proc/PID/environ), or None when it cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    pairs = (item.decode("utf-8", "replace").partition("=") for item in raw.split(b"\0") if b"=" in item)
    return {k: v for k, _, v in pairs}


def _proc_start_time(pid: int) -> str | None:
    """The kernel's start time of a pid (Linux), so a reused pid is never taken for our VM."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[0] if fields else None


def marked_pids(sandbox: Path) -> list[int]:
    """Every live process whose environment carries this VM's marker: also the ones that left the
    process group (setsid, nohup, daemons). Linux only; elsewhere the process group has to do."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    needle = f"{MARKER_ENV}={sandbox}".encode() + b"\0"
    found = []
    me = os.getpid()
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            data = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in data + b"\0" and _proc_state(int(entry.name)) not in (None, "Z", "X"):
            found.append(int(entry.name))
    return found


@dataclass
class BootedVm:
    """A booted VM: its bash process (session and group leader) and its sandbox."""

    sandbox: Path
    pid: int
    start_time: str | None
    booted_at: float
    expires_at: float | None = None
    meta: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] | None = field(default=None, repr=False, compare=False)  # as booted (this process only)
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def pgid(self) -> int:
        return self.pid  # start_new_session makes the bash process its group's leader

    @classmethod
    def load(cls, sandbox: Path) -> BootedVm | None:
        """The VM recorded in a sandbox by whichever process booted it; None when there is none."""
        try:
            doc = json.loads((Path(sandbox) / PID_FILE).read_text())
        except (OSError, ValueError):
            return None
        return cls(
            sandbox=Path(sandbox),
            pid=int(doc["pid"]),
            start_time=doc.get("start_time"),
            booted_at=float(doc.get("booted_at", 0)),
            expires_at=doc.get("expires_at"),
            meta=dict(doc.get("meta") or {}),
        )

    def _save(self) -> None:
        doc = {
            "pid": self.pid,
            "start_time": self.start_time,
            "booted_at": self.booted_at,
            "expires_at": self.expires_at,
            "meta": self.meta,
        }
        tmp = self.sandbox / (PID_FILE + ".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.sandbox / PID_FILE)

    def _leader_is_ours(self) -> bool:
        if self.pid <= 0:  # rebooted with no boot service: nothing runs
            return False
        if self._proc is not None:
            return self._proc.poll() is None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return False
        if self.start_time is not None and _proc_start_time(self.pid) != self.start_time:
            return False  # the pid was reused by another process
        return _proc_state(self.pid) not in ("Z", "X")

    def alive(self) -> bool:
        """Whether the VM's bootstrap is still running."""
        return self._leader_is_ours()

    def returncode(self) -> int | None:
        """The bootstrap's exit status when this process booted it and it has ended."""
        return self._proc.poll() if self._proc is not None else None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the bootstrap to end; True when it has."""
        end = None if timeout is None else time.monotonic() + timeout
        while self.alive():
            if end is not None and time.monotonic() >= end:
                return False
            time.sleep(0.05)
        return True

    def leftovers(self) -> list[int]:
        """Pids of this VM still running (its group while the leader is ours, plus marked ones)."""
        pids = set(marked_pids(self.sandbox))
        if self._leader_is_ours():
            pids.add(self.pid)
        return sorted(pids)

    def _signal_all(self, sig: int) -> bool:
        sent = False
        if self._leader_is_ours():
            try:
                os.killpg(self.pgid, sig)
                sent = True
            except (ProcessLookupError, PermissionError):
                pass
        for pid in marked_pids(self.sandbox):
            try:
                os.kill(pid, sig)
                sent = True
            except (ProcessLookupError, PermissionError):
                pass
        return sent

    def kill(self, grace: float = 3.0) -> bool:
        """Stop the VM like a cloud stops an instance: SIGTERM to its bootstrap's process group
        first (the bootstrap stops its job itself, once, and reports), then to any process that
        escaped the group, SIGKILL for whatever is left after `grace` seconds. A job that saves
        its outputs on SIGTERM is not hit a second time while it saves.
        `grace` 0 is a machine lost at once (power cut, host failure): SIGKILL only, so nothing on
        it can report. Returns whether anything was running. Idempotent; safe from any process."""
        deadline = time.monotonic() + grace
        running = self._leader_is_ours()
        if running and grace > 0:
            try:
                os.killpg(self.pgid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            while self._leader_is_ours() and time.monotonic() < deadline:
                self._reap()
                time.sleep(0.05)
            self._reap()
        if not self._signal_all(signal.SIGTERM if grace > 0 else signal.SIGKILL) and not running:
            self._reap()
            return False
        while time.monotonic() < deadline:
            self._reap()
            if not self.leftovers():
                return True
            time.sleep(0.05)
        end = time.monotonic() + 5
        while time.monotonic() < end:
            # Again each round: a process forked while the last sweep ran was not in it.
            self._signal_all(signal.SIGKILL)
            self._reap()
            if not self.leftovers():
                break
            time.sleep(0.05)
        return True

    def _reap(self) -> None:
        if self._proc is not None:
            self._proc.poll()


def boot(
    script: str,
    sandbox: Path,
    *,
    env: Mapping[str, str] | None = None,
    path_prefix: Sequence[Path] = (),
    base_env: Mapping[str, str] | None = None,
    expires_at: float | None = None,
    meta: Mapping[str, str] | None = None,
) -> BootedVm:
    """Boot a VM: write the script into `sandbox`, run it with bash there in a new session.

    env: extra variables on top of `base_env` (default: `default_base_env()`); path_prefix: dirs
    put first on PATH (stub tools, the interpreter to use); expires_at: epoch seconds after which
    `gc` may kill it. The console (stdout/stderr of bash) goes to `<sandbox>/console.log`.
    """
    sandbox = Path(sandbox).resolve()
    sandbox.mkdir(parents=True, exist_ok=True)
    script_path = sandbox / SCRIPT_FILE
    script_path.write_text(script)
    full_env = dict(default_base_env() if base_env is None else base_env)
    full_env.update(env or {})
    if path_prefix:
        full_env["PATH"] = os.pathsep.join([*(str(p) for p in path_prefix), full_env.get("PATH", "")])
    return _start(["bash", str(script_path)], sandbox, full_env, expires_at, dict(meta or {}))


def _start(
    argv: Sequence[str], sandbox: Path, env: dict[str, str], expires_at: float | None, meta: dict[str, str]
) -> BootedVm:
    env = {**env, MARKER_ENV: str(sandbox)}
    with open(sandbox / CONSOLE_FILE, "ab") as console:
        proc = subprocess.Popen(
            list(argv),
            cwd=sandbox,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    vm = BootedVm(
        sandbox=sandbox,
        pid=proc.pid,
        start_time=_proc_start_time(proc.pid),
        booted_at=time.time(),
        expires_at=expires_at,
        meta=meta,
        env=env,
        _proc=proc,
    )
    vm._save()
    return vm


def reboot(vm: BootedVm, services: Sequence[Sequence[str]], *, grace: float = 3.0) -> BootedVm:
    """Reboot a VM: every process of it gets SIGTERM, what is left after `grace` SIGKILL (a
    shutdown's order), then the boot starts `services` (argv each: the units the VM enabled; the
    user-data is not run again, as cloud-init runs it once per instance). Returns the VM as booted
    again (the first service is its main process); the environment is the first boot's."""
    vm.kill(grace=grace)
    if vm.env is None:
        raise ValueError("only a VM booted by this process can be rebooted (its environment is needed)")
    again = None
    for argv in services:
        started = _start(argv, vm.sandbox, vm.env, vm.expires_at, vm.meta)
        again = again or started
    if again is None:  # nothing enabled: the machine boots and idles
        again = BootedVm(
            sandbox=vm.sandbox,
            pid=0,
            start_time=None,
            booted_at=time.time(),
            expires_at=vm.expires_at,
            meta=vm.meta,
            env=vm.env,
        )
    return again
