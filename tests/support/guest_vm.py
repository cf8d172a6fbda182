"""A real Linux guest under qemu's software emulation (TCG: these machines' /dev/kvm is not one a
stock guest kernel can use), booted from the image of tests/support/guest_image.py.

Each guest boots its own copy of the cached disk (so a reboot or a second boot sees what the first
wrote). Its network is qemu's user mode with `restrict=on`: the guest reaches only the host ports
it is given, each at an address of its own through tests/support/guest_relay.py (the metadata
service at 169.254.169.254:80, as on EC2), never the host's network; the one way in is an optional
forward of a host loopback port to the guest's sshd (:22), what a node's public address and its
caller-only rule are on a cloud. The serial console is read
line by line and each line kept with the host time it arrived, which is what the boot stages are
measured by.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.guest_image import NVIDIA_REPO_URL, GuestImage

RELAY = Path(__file__).resolve().parent / "guest_relay.py"
NET = "169.254.169.0/24"
HOST_ALIAS = "169.254.169.2"
SERVICE_ADDR = "169.254.169.5"  # the host's test services (channel, apt repository), by their own ports
IMDS_ADDR = "169.254.169.254"
# What an EC2 instance's firmware says (cloud-init tells EC2 by it, and only there asks IMDSv2's token)
EC2_UUID = "ec2e1916-9099-7caf-fd21-012345abcdef"
SMBIOS = "type=1,manufacturer=Amazon EC2,product=g4dn.xlarge,serial={uuid},uuid={uuid}"


def instance_uuid(instance_id: str) -> str:
    """The SMBIOS UUID of one instance (EC2's start with `ec2`; each instance has its own)."""
    h = hashlib.sha256(instance_id.encode()).hexdigest()
    return f"ec2{h[:5]}-{h[5:9]}-{h[9:13]}-{h[13:17]}-{h[17:29]}"


REPO_ADDR = NVIDIA_REPO_URL.removeprefix("http://")  # NVIDIA's repositories' stand-in, at port 80
# No `tsc=reliable`: a TSC calibrated while the host is loaded can be far off, and without the
# kernel's clocksource watchdog the guest's clock then ran 20 times too fast (units timed out).
CMDLINE = (
    "console=ttyS0,115200 root=/dev/vda rw rootfstype=ext4 net.ifnames=0 systemd.show_status=1 "
    "systemd.log_color=0 loglevel=4 mitigations=off no_timer_check"
)


@dataclass
class Guest:
    """One running qemu; `lines` holds (seconds since start, console line)."""

    proc: subprocess.Popen[bytes]
    disk: Path
    started: float
    lines: list[tuple[float, str]] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def console(self) -> str:
        with self.cond:
            return "\n".join(line for _, line in self.lines)

    def wait_line(self, pattern: str, timeout: float, start: int = 0) -> tuple[float, str]:
        """The first console line from index `start` on matching `pattern` (regex); AssertionError
        naming the console's tail when it does not come in time or qemu ends first."""
        rx = re.compile(pattern)
        end = time.monotonic() + timeout
        seen = start
        with self.cond:
            while True:
                for t, line in self.lines[seen:]:
                    if rx.search(line):
                        return t, line
                seen = len(self.lines)
                left = end - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and seen == len(self.lines)):
                    tail = "\n".join(line for _, line in self.lines[-40:])
                    raise AssertionError(f"no console line /{pattern}/ in {timeout:.0f} s; console tail:\n{tail}")
                self.cond.wait(min(left, 1.0))

    def wait_exit(self, timeout: float) -> int:
        """qemu's exit status once the guest powered off; AssertionError if it still runs."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            tail = "\n".join(line for _, line in self.lines[-40:])
            raise AssertionError(f"the guest still runs after {timeout:.0f} s; console tail:\n{tail}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.disk.with_suffix(".console.log"), "a") as log:
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace").rstrip("\r\n")
                t = time.monotonic() - self.started
                log.write(f"[{t:7.1f}] {line}\n")
                log.flush()
                with self.cond:
                    self.lines.append((t, line))
                    self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()


def _die_with_parent() -> None:
    """qemu ends with the test process, even when that is killed (PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)


def guest_disk(image: GuestImage, dest: Path) -> Path:
    """A machine's own disk: a sparse copy of the cached image."""
    subprocess.run(["cp", "--sparse=always", str(image.disk), str(dest)], check=True)
    return dest


def guest_url(url: str) -> str:
    """A host service URL (http://127.0.0.1:PORT/...) as the guest reaches it."""
    return url.replace("http://127.0.0.1:", f"http://{SERVICE_ADDR}:")


def boot(
    image: GuestImage,
    disk: Path,
    *,
    imds_port: int,
    ports: tuple[int, ...] = (),
    repo_port: int = 0,
    gpu: tuple[str, int] = ("", 0),
    mem_mib: int = 768,
    uuid: str = EC2_UUID,
    ssh_port: int = 0,
) -> Guest:
    """Start qemu on `disk`: EC2's metadata address relays to `imds_port`, SERVICE_ADDR:PORT to the
    host's PORT for each of `ports`, REPO_ADDR:80 to `repo_port`, and the host's 127.0.0.1:`ssh_port`
    (when given) to the guest's port 22; `gpu` (nvidia-smi's name, count) is what the stand-in
    driver shows (tests/support/guest_apt.py)."""
    relay = f"cmd:{sys.executable} {RELAY}"
    fwds = [f"guestfwd=tcp:{IMDS_ADDR}:80-{relay} {imds_port}"]
    if repo_port:
        fwds.append(f"guestfwd=tcp:{REPO_ADDR}:80-{relay} {repo_port}")
    cmdline = CMDLINE + (f" gpucloud.gpu={gpu[0].replace(' ', '_')} gpucloud.gpus={gpu[1]}" if gpu[0] else "")
    fwds += [f"guestfwd=tcp:{SERVICE_ADDR}:{p}-{relay} {p}" for p in ports]
    if ssh_port:
        fwds.append(f"hostfwd=tcp:127.0.0.1:{ssh_port}-:22")  # restrict=on leaves explicit forwards open
    netdev = ",".join(["user", "id=n0", f"net={NET}", f"host={HOST_ALIAS}", "restrict=on", *fwds])
    argv = [
        shutil.which("qemu-system-x86_64") or "qemu-system-x86_64",
        "-accel",
        "tcg",
        "-m",
        str(mem_mib),
        "-smp",
        "1",
        "-nodefaults",
        "-smbios",
        SMBIOS.format(uuid=uuid),
        "-no-user-config",
        "-display",
        "none",
        "-monitor",
        "none",
        "-serial",
        "stdio",
        "-kernel",
        str(image.kernel),
        "-initrd",
        str(image.initrd),
        "-append",
        cmdline,
        "-drive",
        f"file={disk},format=raw,if=virtio,cache=unsafe",
        "-netdev",
        netdev,
        "-device",
        "virtio-net-pci,netdev=n0,romfile=",  # direct kernel boot: no PXE ROM (ipxe-qemu) needed
    ]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent,  # only prctl runs in the child before exec
    )
    guest = Guest(proc=proc, disk=disk, started=time.monotonic())
    threading.Thread(target=guest._read, daemon=True).start()
    return guest


def tcg_note() -> str:
    """Why a guest cannot use KVM here, for the skip/bench notes."""
    return "software emulation (TCG)" + ("" if not os.path.exists("/dev/kvm") else "; /dev/kvm present but unused")
