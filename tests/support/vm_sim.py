"""The cloud-agnostic half of a VM simulator: boot a fake cloud's instance from its user-data.

A guest is the instance's bootstrap script run by gpucloud's own VM engine (gpucloud/providers/local/engine.py,
the same engine the local provider uses) in a sandbox folder, with the stub `apt-get`, `dpkg`,
`nvidia-smi`, `python3` ... of tests/support/vm_stubs first on PATH. `nvidia-smi` shows the GPU
model and count the instance type has in the catalog. curl is real: the guest talks to the fake
object store through the pre-signed URLs, as a VM would.

What a cloud does when the guest runs `shutdown` differs (AWS with shutdown-behaviour terminate
ends the instance; Azure leaves it "Stopped (allocated)" and billed): a subclass says so in
`on_guest_shutdown`. A per-simulator `shutdown` wrapper records the call through the stub and
drops a marker file that a monitor thread turns into that callback, once per guest.

Cloud-specific simulators (azure_sim.py, and aws_sim.py if it wants) subclass GuestSimulator and
call `boot_guest` / `end_guest` when their fake cloud creates or deletes an instance.

A guest whose instance was given a session key (`Guest.ssh_key`, set by the cloud's simulator) can
be reached by `gpucloud ssh`: `sshd_port(vm_id)` starts its own sshd (tests/support/sshd.py) on
first use, so guests nobody logs into pay for none; it admits that key only, its logins get the
guest's environment, and it stops when the guest ends.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpucloud.contract.provider import Capabilities
from gpucloud.providers.local import engine as vm_engine
from tests.support.sshd import SshdServer, start_sshd

STUBS = Path(__file__).resolve().parent / "vm_stubs"
NVIDIA_REPO_INDEX = Path(__file__).resolve().parent.parent / "data" / "nvidia_repo_packages.txt"
SHUTDOWN_MARKER = "guest-shutdown"
# nvidia-smi's names for the catalog's models (every token of the model must appear as a word).
GPU_NAMES = {
    "K80": "Tesla K80",
    "K40": "Tesla K40m",
    "M60": "Tesla M60",
    "P100": "Tesla P100-PCIE-16GB",
    "P40": "Tesla P40",
    "V100": "Tesla V100-PCIE-16GB",
    "T4": "Tesla T4",
    "A10G": "NVIDIA A10G",
    "A10": "NVIDIA A10",
    "L4": "NVIDIA L4",
    "L40S": "NVIDIA L40S",
    "A100-40GB": "NVIDIA A100-SXM4-40GB",
    "A100-80GB": "NVIDIA A100 80GB PCIe",
    "H100": "NVIDIA H100 80GB HBM3",
    "H200": "NVIDIA H200",
    "B200": "NVIDIA B200",
    "GB200": "NVIDIA GB200",
    "H100-NVL": "NVIDIA H100 NVL",
    "T4G": "NVIDIA T4G",
    "V100-32GB": "Tesla V100-SXM2-32GB",
}
# A cloud VM's work folder (what `gpucloud ssh` exports and cds into); a guest's is its sandbox's vm/.
CLOUD_VM_DIR = Capabilities.__dataclass_fields__["vm_dir"].default
# sshd's ForceCommand for a guest's logins: the session's command names the cloud's work folder,
# which on this guest's "disk" is $GPUCLOUD_VM_DIR, so it is read as that (and nothing is written
# to the host's CLOUD_VM_DIR).
GUEST_LOGIN = f"""#!/bin/bash
[ -n "${{SSH_ORIGINAL_COMMAND:-}}" ] || exec bash -l
cloud={CLOUD_VM_DIR}
exec bash -c "${{SSH_ORIGINAL_COMMAND//"$cloud"/$GPUCLOUD_VM_DIR}}"
"""
CUDA_REPOS = ("ubuntu1804", "ubuntu2004", "ubuntu2204", "ubuntu2404")


def _gpu_mib(gpu: str) -> int:
    """The GPU's memory as nvidia-smi reports it (MiB), from the catalog (16384 when unknown)."""
    from gpucloud.catalog import load_catalog

    model = load_catalog().gpus.get(gpu)
    return int(model.memory_gib * 1024) if model else 16384


REPO_ARCHES = ("x86_64", "sbsa")  # arm64 servers use NVIDIA's sbsa path
IMAGE_PARTS = ("pkgs", "py")  # what of a guest's stub state is "on its disk" (a baked image keeps it)


def install_calls(calls: list[str]) -> list[str]:
    """The apt-get and pip installs in a guest's stub call log (a baked image's stack stage has none)."""
    return [
        c
        for c in calls
        if (c.startswith("apt-get ") and " install " in f" {c} ") or c.startswith("python3 -m pip install")
    ]


def guest_calls(sim: GuestSimulator, vm_id: str) -> list[str]:
    """The stub call log of one simulated machine (apt-get, pip, nvidia-smi ... in order)."""
    with sim.lock:
        guest = sim.guests.get(vm_id)
    assert guest is not None, vm_id
    path = guest.sandbox / "stub-state" / "calls"
    return path.read_text().splitlines() if path.exists() else []


def stub_counts(state: Path) -> dict[str, int]:
    """Invocations per stub tool (apt-get, dpkg, nvidia-smi, python3, systemctl ...) of one guest."""
    folder = Path(state) / "count"
    return {f.name: int(f.read_text() or 0) for f in folder.iterdir()} if folder.is_dir() else {}


def specifiers(value: str) -> str:
    """systemd's `%` specifier expansion, stricter than systemd: `%%` is `%`, and any other `%x` is
    refused (a unit gpucloud writes must escape every `%` of a path)."""
    parts = value.split("%%")
    assert not any("%" in p for p in parts), f"an unescaped systemd specifier in {value!r}"
    return "%".join(parts)


def boot_services(etc: Path) -> list[list[str]]:
    """ExecStart of every unit enabled for multi-user.target under `etc`, split as systemd splits a
    command line (quotes, `\\` escapes, then specifiers)."""
    wants = Path(etc) / "systemd" / "system" / "multi-user.target.wants"
    out = []
    for unit in sorted(wants.iterdir()) if wants.is_dir() else []:
        text = unit.resolve().read_text()
        cond = next(
            (line.split("=", 1)[1] for line in text.splitlines() if line.startswith("ConditionPathExists=")), ""
        )
        if cond and not Path(specifiers(cond)).exists():
            continue
        for line in text.splitlines():
            if line.startswith("ExecStart="):
                out.append([specifiers(word) for word in shlex.split(line.split("=", 1)[1])])
    return out


def gpu_of(cloud: str, instance_type: str) -> tuple[str, int]:
    """(catalog GPU model, count) of an instance type; ("", 0) when the catalog has no GPU for it."""
    from gpucloud.catalog import load_catalog

    for off in load_catalog().offerings:
        if off.cloud == cloud and off.instance_type.lower() == instance_type.lower():
            return off.gpu, off.gpu_count
    return "", 0


@dataclass
class Guest:
    vm_id: str
    sandbox: Path
    vm: vm_engine.BootedVm
    gpu: str
    gpu_count: int
    shut_down: bool = False
    ended: bool = False
    meta: dict[str, str] = field(default_factory=dict)
    ssh_key: str = ""  # the public key the cloud was given for the instance (cloud-init installs it)
    sshd: SshdServer | None = None  # the guest's sshd, once a test asked for it (`sshd_port`)

    def console(self) -> str:
        try:
            return (self.sandbox / vm_engine.CONSOLE_FILE).read_text(errors="replace")
        except OSError:
            return ""

    def stub_calls(self) -> list[str]:
        try:
            return (self.sandbox / "stub-state" / "calls").read_text().splitlines()
        except OSError:
            return []


class GuestSimulator:
    """Boots and ends guests; subclasses connect it to a fake cloud."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.guests: dict[str, Guest] = {}
        self._gone: set[str] = set()
        self.lock = threading.RLock()
        self._stop = threading.Event()
        self._repo = self._make_nvidia_repo()
        self._hooks = self._make_hooks()
        self._monitor = threading.Thread(target=self._watch, name=f"{type(self).__name__}-monitor", daemon=True)
        self._monitor.start()

    # ---- the world the guest sees ---------------------------------------------------------------
    def _make_nvidia_repo(self) -> Path:
        """A file:// stand-in for NVIDIA's apt repository: only the keyring package is fetched."""
        repo = self.root / "nvidia-repo"
        for name in CUDA_REPOS:
            for arch in REPO_ARCHES:
                d = repo / name / arch
                d.mkdir(parents=True, exist_ok=True)
                (d / "cuda-keyring_1.1-1_all.deb").write_bytes(b"!<arch>\nfake keyring\n")
        return repo

    def _make_hooks(self) -> Path:
        hooks = self.root / "hooks"
        hooks.mkdir(exist_ok=True)
        script = hooks / "shutdown"
        script.write_text(
            "#!/bin/bash\n"
            "# Simulator hook: the stub records the call; the marker tells the fake cloud.\n"
            f'"{STUBS}/shutdown" "$@"\n'
            f': >"$SIM_GUEST_DIR/{SHUTDOWN_MARKER}"\n'
            "exit 0\n"
        )
        script.chmod(0o755)
        return hooks

    def guest_env(self, sandbox: Path, gpu: str, count: int) -> dict[str, str]:
        return {
            "HOME": str(sandbox / "home"),
            "GPUCLOUD_VM_DIR": str(sandbox / "vm"),
            "GPUCLOUD_NVIDIA_REPO": self._repo.as_uri(),
            "GPUCLOUD_CUDA_ROOT": str(sandbox / "no-cuda"),
            "STUB_STATE": str(sandbox / "stub-state"),
            "STUB_GPU_NAME": GPU_NAMES.get(gpu, f"NVIDIA {gpu}"),
            "STUB_GPU_COUNT": str(count),
            "STUB_REAL_PYTHON": sys.executable,
            "SIM_GUEST_DIR": str(sandbox),
            "GPUCLOUD_ETC": str(sandbox / "etc"),  # apt preferences and systemd units of this guest
            # apt's locks are this guest's, not the host's: a host apt (unattended-upgrades) must not
            # hold a simulated stack stage for minutes
            "GPUCLOUD_APT_LOCKS": str(sandbox / "etc" / "apt-lock"),
            "STUB_APT_REPO": str(NVIDIA_REPO_INDEX),
            "STUB_GPU_MEM_TOTAL": str(_gpu_mib(gpu)),
            # A guest shares this host's few cores with the other test workers: PyTorch's intra-op
            # threads (one per host core, spinning between ops) were 2 of the 5 CPU-s of a 3-epoch
            # example on 2 cores, for the same result. torchrun sets the same for each rank.
            "OMP_NUM_THREADS": "1",
            # scripted GPU use for the sampler (tests set them in this process's environment)
            **{k: os.environ[k] for k in ("STUB_GPU_UTIL", "STUB_GPU_MEM_USED") if k in os.environ},
        }

    # ---- booting and ending ---------------------------------------------------------------------
    def boot_guest(
        self,
        vm_id: str,
        script: str,
        *,
        gpu: str,
        gpu_count: int,
        env: dict[str, str],
        name: str | None = None,
        disk: Path | None = None,
    ) -> Guest | None:
        """Run the instance's user-data; None when the instance was deleted before it booted.
        `disk`: the stub state of the machine a baked image was taken from (its installed packages
        and Python modules are on this guest's disk too)."""
        with self.lock:
            if vm_id in self._gone or vm_id in self.guests or self._stop.is_set():
                return None
            sandbox = self.root / "vms" / (name or str(len(self.guests)))
            for sub in ("home", "vm", "stub-state"):
                (sandbox / sub).mkdir(parents=True, exist_ok=True)
            if disk is not None:
                for part in IMAGE_PARTS:
                    if (disk / part).is_dir():
                        shutil.copytree(disk / part, sandbox / "stub-state" / part, dirs_exist_ok=True)
            full_env = {**self.guest_env(sandbox, gpu, gpu_count), **env}
            booted = vm_engine.boot(script, sandbox, env=full_env, path_prefix=[self._hooks, STUBS])
            guest = Guest(vm_id=vm_id, sandbox=sandbox, vm=booted, gpu=gpu, gpu_count=gpu_count)
            self.guests[vm_id] = guest
            return guest

    def end_guest(self, vm_id: str) -> None:
        """The instance is gone (deleted or terminated): its processes end, as a VM's do."""
        with self.lock:
            self._gone.add(vm_id)
            guest = self.guests.get(vm_id)
            if guest is None or guest.ended:
                return
            guest.ended = True
        self._halt(guest, grace=2.0)

    def _halt(self, guest: Guest, grace: float) -> None:
        """The machine is down: its sshd (no more logins) and every process of it end."""
        if guest.sshd is not None:
            guest.sshd.stop()
        guest.vm.kill(grace=grace)

    def sshd_port(self, vm_id: str) -> int:
        """The loopback port of the guest's own sshd, started on first use (a guest whose instance
        was given a session key only): logins by that key alone (the login user's authorized_keys,
        as cloud-init writes it), with the guest's environment (its stubs first on PATH, its GPU,
        GPUCLOUD_VM_DIR, HOME; its sessions are the guest's processes and end with it)."""
        with self.lock:
            guest = self.guests[vm_id]
            assert guest.ssh_key, f"{vm_id} was given no session key: its image has no sshd to reach"
            assert not guest.ended and not guest.shut_down, f"{vm_id} is down"
            if guest.sshd is None:
                login = self.root / "guest-login"
                if not login.exists():
                    login.write_text(GUEST_LOGIN)
                    login.chmod(0o755)
                folder = guest.sandbox / "sshd"
                folder.mkdir(exist_ok=True)
                keys = guest.sandbox / "home" / ".ssh" / "authorized_keys"
                keys.parent.mkdir(mode=0o700, exist_ok=True)
                keys.write_text(guest.ssh_key.strip() + "\n")
                env = dict(guest.vm.env or {})
                guest.sshd = start_sshd(
                    vm_id.rsplit("/", 1)[-1], folder, authorized_keys=keys, env=env, force_command=str(login)
                )
            return guest.sshd.port

    def reboot_guest(self, vm_id: str, *, down_s: float = 0.0, on_down: Callable[[], None] | None = None) -> Guest:
        """Reboot a guest as its cloud would (e.g. Azure's GPU driver extension): systemd's
        `list-jobs` shows reboot.target while every process gets SIGTERM, then SIGKILL; after
        `down_s` seconds the boot starts the services the guest enabled under
        $GPUCLOUD_ETC/systemd/system/multi-user.target.wants (their ExecStart), not the user-data."""
        with self.lock:
            guest = self.guests[vm_id]
        marker = guest.sandbox / "stub-state" / "rebooting"
        marker.touch()
        guest.vm.kill(grace=3.0)
        marker.unlink()
        if on_down is not None:
            on_down()
        time.sleep(down_s)
        guest.vm = vm_engine.reboot(guest.vm, boot_services(guest.sandbox / "etc"), grace=0.1)
        return guest

    def on_guest_shutdown(self, guest: Guest) -> None:
        """What the cloud does when the guest shuts itself down (subclasses)."""

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            with self.lock:
                pending = [
                    g for g in self.guests.values() if not g.shut_down and (g.sandbox / SHUTDOWN_MARKER).exists()
                ]
                for g in pending:
                    g.shut_down = True
            for g in pending:
                # The guest halts: its processes end. What happens to the instance is the cloud's call.
                self._halt(g, grace=2.0)
                self.on_guest_shutdown(g)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until no guest's bootstrap runs any more."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                running = [g for g in self.guests.values() if g.vm.alive()]
            if not running:
                return True
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        """End every guest and stop watching (test teardown)."""
        self._stop.set()
        with self.lock:
            guests = list(self.guests.values())
        for g in guests:
            self._halt(g, grace=1.0)
        self._monitor.join(timeout=2)

    def leftover_processes(self) -> list[int]:
        with self.lock:
            guests = list(self.guests.values())
        return [pid for g in guests for pid in g.vm.leftovers()]
