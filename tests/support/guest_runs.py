"""An AWS-shaped run on a real booted guest (tests/support/guest_vm.py): gpucloud's own rendered
user-data (the shim of an AWS node: backstop as a systemd timer, `shutdown -h now` at the end)
served as the instance's user-data by an IMDSv2 metadata service, so cloud-init's EC2 datasource
fetches it and runs it as it runs user scripts. The run's channel is a file channel behind an HTTP
front (tests/support/s3_front.py) that the guest reaches through its relay; the instance is
`running` while qemu runs and `terminated` once the guest powered itself off (AWS's
instance-initiated shutdown with shutdown behaviour terminate).

With `session_key` the instance is launched as with a KeyName: the metadata service serves the
key's public half, cloud-init installs it for the image's login user, and the host's loopback port
`ssh_port` reaches the guest's sshd (what the node's public address is on EC2).

Host times (seconds since qemu started) of what the node did are kept in `marks`: the shim's first
request (its manifest), the agent archive, the agent's first status, and the job's first line.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpucloud.plan.stacks import Stack
from tests.support.guest_apt import RepoServer
from tests.support.guest_image import GuestImage
from tests.support.guest_imds import Ec2Metadata
from tests.support.guest_vm import Guest, boot, guest_disk, guest_url, instance_uuid
from tests.support.render_inputs import K80, T4
from tests.support.s3_front import S3Front
from tests.support.sshd import free_port
from tests.support.vm_boot import Vm, make_vm
from tests.support.vm_sim import GPU_NAMES

STACKS = {"K80": K80, "T4": T4}
# Boot stages by the first console line that shows them
CONSOLE_MARKS = (
    ("initramfs", "Loading, please wait"),
    ("systemd", "Reached target local-fs.target"),
    ("cloud-init init-local", "running 'init-local'"),
    ("cloud-init init (network)", "running 'init' at"),
    ("cloud-init modules:config", "running 'modules:config'"),
    ("cloud-init modules:final", "running 'modules:final'"),
    ("shim: backstop timer started", "Started gpucloud-backstop"),
)


class TimedFront(S3Front):
    """The channel's HTTP front, keeping the host time of every request of the node."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.times: list[tuple[float, str, str]] = []

    def fault(self, method: str, path: str, query: str, content_type: str, agent: str = "") -> int:
        self.times.append((time.monotonic(), method, path))
        return super().fault(method, path, query, content_type, agent)

    def first(self, method: str, path_part: str) -> float | None:
        return next((t for t, m, p in list(self.times) if m == method and path_part in p), None)


@dataclass
class GuestRun:
    """One instance: its run (channel, run id), metadata service, front and qemu."""

    vm: Vm
    front: TimedFront
    imds: Ec2Metadata
    guest: Guest
    disk: Path
    ssh_port: int = 0
    first_line_at: float | None = None
    _watch: threading.Thread | None = field(default=None, repr=False)

    @property
    def state(self) -> str:
        """The instance's state as EC2 would show it."""
        return "running" if self.guest.proc.poll() is None else "terminated"

    def watch_first_line(self, marker: str) -> None:
        """Note the host time the job's line `marker` first reached the channel."""

        def poll() -> None:
            while self.first_line_at is None and self.guest.proc.poll() is None:
                try:
                    if marker in self.vm.log():
                        self.first_line_at = time.monotonic()
                        return
                except (OSError, AssertionError):
                    pass
                time.sleep(0.1)

        self._watch = threading.Thread(target=poll, daemon=True)
        self._watch.start()

    def marks(self) -> dict[str, float | None]:
        """Host seconds since qemu started at which each stage was first seen."""
        t0 = self.guest.started

        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - t0, 1)

        console = {
            name: next((round(t, 1) for t, line in list(self.guest.lines) if pattern in line), None)
            for name, pattern in CONSOLE_MARKS
        }
        return {
            **console,
            "shim: manifest GET": rel(self.front.first("GET", "/manifest")),
            "shim: agent GET": rel(self.front.first("GET", "agent")),
            "agent: first status PUT": rel(self.front.first("PUT", "status.json")),
            "job: first line in channel": rel(self.first_line_at),
        }

    def stop(self) -> None:
        self.guest.kill()
        self.front.stop()
        self.imds.stop()


def start_guest_run(
    tmp: Path,
    image: GuestImage,
    repo: RepoServer,
    *,
    gpu: str = "T4",
    stack: Stack | None = None,
    disk: Path | None = None,
    instance_id: str = "i-0guest",
    session_key: tuple[str, str] = ("", ""),
    **vm_kw: Any,
) -> GuestRun:
    """Render an AWS node's user-data for a job of one `gpu` (make_vm's keywords; the stack without
    its framework wheel, which no test service serves) and boot a guest showing that GPU.
    `session_key`: (key pair name, public key) the instance is launched with."""
    front = TimedFront(tmp / "channel").start()
    stack = stack or replace(STACKS[gpu], framework="none")
    url_map = lambda url: guest_url(front.url_map(url))  # noqa: E731
    vm = make_vm(tmp, provider="aws", gpu=gpu, stack=stack, url_map=url_map, **{"deadline_s": 3600, **vm_kw})
    # every channel URL of the manifest (make_vm maps the *_get/*_put ones; the log folder too)
    key = f"runs/{vm.run_id}/node-0/manifest"
    text = vm.channel.get_bytes(key).decode().replace(Path(tmp / "channel").resolve().as_uri(), guest_url(front.base))
    vm.channel.put_bytes(key, text.encode())
    imds = Ec2Metadata(instance_id, vm.script.read_text(), key=session_key).start()
    disk = disk or guest_disk(image, tmp / "disk.raw")
    port = int(front.base.rsplit(":", 1)[1])
    uuid = instance_uuid(instance_id)
    ssh_port = free_port() if session_key[0] else 0
    guest = boot(
        image,
        disk,
        imds_port=imds.port,
        ports=(port,),
        repo_port=repo.port,
        gpu=(GPU_NAMES[gpu], 1),
        uuid=uuid,
        ssh_port=ssh_port,
    )
    return GuestRun(vm=vm, front=front, imds=imds, guest=guest, disk=disk, ssh_port=ssh_port)
