"""The Azure VM simulator: every VM the fake ARM server creates boots from its custom data.

When a VM's creation completes, the guest runs with `nvidia-smi` showing the size's GPUs (from
the catalog), with GPUCLOUD_NODE_IP=127.0.0.1 (every guest lives on this host, so loopback is the
address a peer reaches it at; on Azure the bootstrap finds the NIC's private address itself) and
with GPUCLOUD_IMDS_ENDPOINT / GPUCLOUD_AZURE_ARM_ENDPOINT pointing at the fake ARM server: the
bootstrap's self-delete gets a token for the VM's own managed identity and DELETEs its resource
group there, which works only if the provider granted that identity a role on the group. A
`shutdown` inside the guest stops the guest but leaves the VM allocated (power state "stopped"), as
on Azure. Deleting the VM or its group ends the guest.

A VM given ssh public keys (osProfile.linuxConfiguration.ssh.publicKeys, what the Linux agent
installs for the admin user) gets them as its session keys: a test's `sshd_port(vm_id)` starts the
guest's own sshd (vm_sim.py), which admits those keys only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fake_arm import FakeArm, Resource
from tests.support.vm_sim import GPU_NAMES, Guest, GuestSimulator, gpu_of

VM_TYPE = "microsoft.compute/virtualmachines"
EXTENSION_TYPE = "microsoft.compute/virtualmachines/extensions"
DRIVER_EXTENSION = "nvidiagpudriverlinux"
GRID_DRIVER = "550.144.06"  # what the stub's nvidia-smi reports once the GRID extension ran
GUEST_NODE_IP = "127.0.0.1"


def guest_env_gpu_name(gpu: str) -> str:
    return GPU_NAMES.get(gpu, f"NVIDIA {gpu}")


class AzureVmSimulator(GuestSimulator):
    def __init__(self, arm: FakeArm, root: Path) -> None:
        super().__init__(root)
        self.arm = arm
        self.booted: list[str] = []
        self.driver_extensions: dict[str, str] = {}  # VM id (lower case) -> GRID driver its extension installed
        self.reboot_on_driver_extension = False
        self.rebooted: list[str] = []
        self.extra_env: dict[str, str] = {}  # added to every guest's environment (e.g. CURL_CA_BUNDLE)
        arm.on_event(self._on_event)

    def _on_event(self, event: str, res: Resource) -> None:
        # Called with the fake's lock held: hand the work to a thread.
        if res.type.lower() == EXTENSION_TYPE and event == "extension_created":
            props = res.body.get("properties", {})
            if props.get("type", "").lower() == DRIVER_EXTENSION:
                # the extension installs the GRID driver its settings pin (else its own latest)
                version = str((props.get("settings") or {}).get("driverVersion") or GRID_DRIVER)
                threading.Thread(
                    target=self._driver_installed, args=(res.id.rsplit("/extensions/", 1)[0], version), daemon=True
                ).start()
            return
        if res.type.lower() != VM_TYPE:
            return
        if event == "vm_created":
            threading.Thread(target=self._boot, args=(res,), daemon=True).start()
        elif event == "deleted":
            threading.Thread(target=self.end_guest, args=(res.id,), daemon=True).start()

    def _boot(self, res: Resource) -> None:
        script = self.arm.custom_data(res.id)
        if not script:
            return  # a VM without custom data just idles
        size = res.body["properties"]["hardwareProfile"]["vmSize"]
        gpu, count = gpu_of("azure", size)
        principal = (res.body.get("identity") or {}).get("principalId", "none")
        rg = res.id.split("/")[4]
        env = {
            # The multi-node barrier publishes this as the node's address (MASTER_ADDR for rank 0).
            "GPUCLOUD_NODE_IP": GUEST_NODE_IP,
            "GPUCLOUD_IMDS_ENDPOINT": self.arm.imds_endpoint(principal),
            "GPUCLOUD_AZURE_ARM_ENDPOINT": self.arm.url,
            **self.extra_env,
        }
        with self.lock:
            if res.id.lower() in self.driver_extensions:
                env["STUB_DRIVER"] = self.driver_extensions[res.id.lower()]
        name = f"{rg}-{res.id.rsplit('/', 1)[1]}"
        with self.lock:
            old = self.guests.get(res.id)
        if old is not None:
            # The same VM id created again (a spot relaunch in the run's re-created resource group):
            # a new machine, in a sandbox of its own.
            self.end_guest(res.id)
            with self.lock:
                self.guests.pop(res.id, None)
                self._gone.discard(res.id)
                name += f"-{sum(1 for b in self.booted if b == res.id)}"
        image = ((res.body.get("properties") or {}).get("storageProfile") or {}).get("imageReference") or {}
        guest = self.boot_guest(
            res.id, script, gpu=gpu, gpu_count=count, env=env, name=name, disk=self._image_disk(image.get("id"))
        )
        if guest is None:
            return
        linux = ((res.body["properties"].get("osProfile") or {}).get("linuxConfiguration")) or {}
        guest.ssh_key = "\n".join(k.get("keyData", "") for k in (linux.get("ssh") or {}).get("publicKeys") or [])
        guest.meta.update(size=size, gpu_name=guest_env_gpu_name(gpu))
        self.booted.append(res.id)
        with self.arm.lock:
            exists = res.id.lower() in self.arm.resources
        if not exists:  # deleted while it booted
            self.end_guest(res.id)

    def _image_disk(self, image_id: str | None) -> Path | None:
        """A managed image taken of a simulated VM carries that VM's disk: its guest's stub state."""
        if not image_id:
            return None
        with self.arm.lock:
            image = self.arm.resources.get(image_id.lower())
            source = (
                ((image.body.get("properties") or {}).get("sourceVirtualMachine") or {}).get("id") if image else None
            )
        with self.lock:
            guest = next((g for vid, g in self.guests.items() if source and vid.lower() == source.lower()), None)
        return guest.sandbox / "stub-state" if guest is not None else None

    def _driver_installed(self, vm_id: str, version: str = GRID_DRIVER) -> None:
        """The GRID driver extension ran: the guest's nvidia-smi now finds a driver (STUB_DRIVER, or
        its state file for a guest that is already running). With `reboot_on_driver_extension` the
        extension reboots the VM once the guest waits for the driver, as Microsoft says it might."""
        with self.lock:
            self.driver_extensions[vm_id.lower()] = version
            guest = self.guests.get(vm_id)
        if self.reboot_on_driver_extension:
            end = time.monotonic() + 60
            while time.monotonic() < end and (guest is None or "waiting for the GRID driver" not in guest.console()):
                time.sleep(0.1)
                with self.lock:
                    guest = self.guests.get(vm_id)
        if guest is not None:
            (guest.sandbox / "stub-state" / "driver").write_text(version)
            if self.reboot_on_driver_extension:
                self.rebooted.append(vm_id)
                self.reboot_guest(vm_id)

    def on_guest_shutdown(self, guest: Guest) -> None:
        """Azure: the guest is down, the VM stays allocated (and billed) until deleted."""
        self.arm.set_power_state(guest.vm_id, "stopped")

    def guest(self, vm_id: str) -> Guest | None:
        with self.lock:
            return self.guests.get(vm_id)

    def preempt(self, vm_id: str) -> None:
        """Azure evicts the VM: its Scheduled Events (the fake ARM's IMDS) show `Preempt`."""
        self.arm.preempt(vm_id)


@pytest.fixture
def azure_sim(fake_arm_server: FakeArm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzureVmSimulator]:
    """A simulator for one test (the fake ARM server is shared; its listeners are per test)."""
    sim = AzureVmSimulator(fake_arm_server, tmp_path_factory.mktemp("azure-vms"))
    try:
        yield sim
    finally:
        sim.stop()
        with fake_arm_server.lock:
            fake_arm_server.listeners.remove(sim._on_event)
