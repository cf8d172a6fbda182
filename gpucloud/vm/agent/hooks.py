"""Provider-specific behaviour on the node, one hook object per kind of provider, chosen by the
job config's `self_termination` and `preemption_notice` (the provider's Capabilities), never by a
provider's name in the core: how the machine ends itself, where a spot interruption notice comes
from, the launch index of a node that shares its user-data, and the boot unit for reboots.

Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from pathlib import Path
from typing import Callable, Dict, Optional
from urllib.parse import quote

from gpucloud.vm.agent.transfer import Transfer

# The VM's managed identity token for ARM, from IMDS (the self-delete's credential); `resource` is
# the ARM audience of the VM's cloud (the job config's endpoints; public cloud by default).
MANAGED_IDENTITY_TOKEN = "/metadata/identity/oauth2/token?api-version=2018-02-01&resource="

IMDS_DEFAULT = "http://169.254.169.254"
ARM_DEFAULT = "https://management.azure.com"
ARM_AUDIENCE_DEFAULT = "https://management.azure.com/"
DELETE_TRIES = 40
DELETE_PAUSE_S = 15.0
PID1_CMDLINE = "/proc/1/cmdline"


class Hooks:
    """The local machine: the agent's exit ends the run (the caller's own machine stays)."""

    self_termination = "exit"
    reboot_safe = False

    def __init__(
        self, transfer: Transfer, environ: Dict[str, str], log: Callable[[str], None], sleep: Callable[[float], None]
    ) -> None:
        self.transfer = transfer
        self.environ = environ
        self.log = log
        self.sleep = sleep
        self.imds = environ.get("GPUCLOUD_IMDS_ENDPOINT", IMDS_DEFAULT)

    def end_machine(self, peers_running: Optional[Callable[[], str]] = None) -> None:
        """Self-teardown after the final status: nothing here (the process exits)."""

    def notice(self) -> Optional[str]:
        """The cloud's own interruption notice, or None."""
        return None

    def launch_index(self) -> Optional[int]:
        return None

    def rebooting(self) -> bool:
        return False

    def boot_unit(self, vm_dir: Path, shim: Path, run_id: str) -> bool:
        return True


class ShutdownHooks(Hooks):
    """A cloud VM whose shutdown ends it (AWS: instance-initiated shutdown = terminate)."""

    self_termination = "shutdown"
    reboot_safe = True

    def end_machine(self, peers_running: Optional[Callable[[], str]] = None) -> None:
        subprocess.run(["sync"], check=False)
        subprocess.run(["shutdown", "-h", "now"], check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def rebooting(self) -> bool:
        """systemd shows reboot.target among its jobs while it stops the units. A unit with
        KillMode=process (cloud-init's cloud-final.service, which runs the user-data and so the
        agent) leaves its processes to the last SIGTERM, sent once PID 1 is systemd-shutdown:
        `systemctl` answers nothing then, and PID 1's own command line says `reboot`."""
        try:
            with open(PID1_CMDLINE, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            argv = []
        if argv and argv[0].endswith(b"systemd-shutdown") and b"reboot" in argv[1:]:
            return True
        try:
            out = subprocess.run(["systemctl", "list-jobs"], capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            return False
        return "reboot.target" in out.stdout

    def boot_unit(self, vm_dir: Path, shim: Path, run_id: str) -> bool:
        """A unit on the disk runs `sh boot.sh resume W` at every boot (docs/STACKS.md, "Reboots")."""
        etc = self.environ.get("GPUCLOUD_ETC")
        if not etc and not Path("/run/systemd/system").is_dir():
            return True
        folder = Path(etc or "/etc") / "systemd" / "system"
        boot = vm_dir / "boot.sh"
        if any(ch in str(vm_dir) for ch in "\n\r\x00"):  # a line break would end the unit's line
            return False
        try:
            folder.mkdir(parents=True, exist_ok=True)
            boot.write_bytes(shim.read_bytes())
            (folder / "gpucloud-resume.service").write_text(
                f"[Unit]\nDescription=gpucloud run {_unit_value(run_id)}: resume after a reboot\n"
                f"ConditionPathExists={_unit_value(str(boot))}\n"
                "Wants=network-online.target\nAfter=network-online.target cloud-init.service\n[Service]\n"
                f"ExecStart=/bin/sh {_unit_word(str(boot))} resume {_unit_word(str(vm_dir))}\n"
                "[Install]\nWantedBy=multi-user.target\n"
            )
            with open(vm_dir / "stack.log", "ab") as out:
                for argv in (["systemctl", "daemon-reload"], ["systemctl", "enable", "gpucloud-resume.service"]):
                    if subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False).returncode:
                        return False
        except OSError:
            return False
        return True


def _unit_value(text: str) -> str:
    """A unit file value taken as it is: systemd expands `%` specifiers in it, so `%` is doubled."""
    return text.replace("%", "%%")


def _unit_word(text: str) -> str:
    """One ExecStart argument as systemd splits the line: double-quoted, with `\\` and `"` escaped
    (systemd.service, "Command lines") and `%` doubled; a folder with a space stays one argument."""
    return '"' + _unit_value(text.replace("\\", "\\\\").replace('"', '\\"')) + '"'


class AwsSpotHooks(ShutdownHooks):
    """EC2: IMDSv2 for the spot instance-action and the launch index of one RunInstances call."""

    def _token(self, ttl: int, max_time: float) -> Optional[str]:
        tok = self.transfer.request(
            "PUT", f"{self.imds}/latest/api/token", [f"X-aws-ec2-metadata-token-ttl-seconds: {ttl}"], max_time=max_time
        )
        return tok.decode() if tok else None

    def notice(self) -> Optional[str]:
        tok = self._token(60, 2)
        if tok is None:
            return None
        out = self.transfer.request(
            "GET",
            f"{self.imds}/latest/meta-data/spot/instance-action",
            [f"X-aws-ec2-metadata-token: {tok}"],
            max_time=2,
        )
        text = (out or b"").decode("utf-8", "replace")
        compact = re.sub(r"\s", "", text)
        return f"spot interruption notice {compact}" if '"action"' in text else None

    def launch_index(self) -> Optional[int]:
        for i in range(1, 6):
            tok = self._token(300, 10)
            out = (
                self.transfer.request(
                    "GET",
                    f"{self.imds}/latest/meta-data/ami-launch-index",
                    [f"X-aws-ec2-metadata-token: {tok}"],
                    max_time=10,
                )
                if tok
                else None
            )
            if out is not None and out.strip().isdigit():
                return int(out.strip())
            self.sleep(i)
        return None


class AzureHooks(ShutdownHooks):
    """Azure: a guest shutdown keeps billing, so the node deletes its own resource group through
    its managed identity (IMDS token -> ARM DELETE); Scheduled Events carry the Preempt notice."""

    self_termination = "azure-delete"

    def __init__(self, *args, endpoints: Optional[Dict[str, str]] = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        endpoints = endpoints or {}
        # The cloud the CLI is configured for (a sovereign cloud's ARM, not the public one's).
        self.arm = (endpoints.get("arm") or self.environ.get("GPUCLOUD_AZURE_ARM_ENDPOINT") or ARM_DEFAULT).rstrip("/")
        self.audience = endpoints.get("arm_audience") or (
            self.arm + "/" if endpoints.get("arm") else ARM_AUDIENCE_DEFAULT
        )
        self.first_call: Optional[threading.Thread] = None
        self.first_events: Optional[bytes] = None

    def notice(self) -> Optional[str]:
        """The first Scheduled Events call may take up to 2 minutes while the service starts
        (Azure's Scheduled Events doc): it runs once beside the guard, never cut short at 2 s and
        never holding up the guard's polls; its answer counts like a poll's."""
        se = f"{self.imds}/metadata/scheduledevents?api-version=2020-07-01"
        if self.first_call is None:
            self.first_call = threading.Thread(target=self._first_events, args=(se,), daemon=True, name="events")
            self.first_call.start()
        first = self.first_events or b""
        out = first if b'"Preempt"' in first else self.transfer.request("GET", se, ["Metadata:true"], max_time=2)
        return "Scheduled Events: Preempt" if out and b'"Preempt"' in out else None

    def _first_events(self, url: str) -> None:
        self.first_events = self.transfer.request("GET", url, ["Metadata:true"], max_time=120)

    def end_machine(self, peers_running: Optional[Callable[[], str]] = None) -> None:
        self.delete_self(peers_running)
        super().end_machine()

    def delete_self(self, peers_running: Optional[Callable[[], str]] = None) -> bool:
        tok = None
        for i in range(1, 6):
            body = self.transfer.request(
                "GET",
                self.imds + MANAGED_IDENTITY_TOKEN + quote(self.audience, safe=":/"),
                ["Metadata:true"],
            )
            if body:
                tok = _json_field(body, "access_token")
                break
            self.sleep(i)
        meta = (
            self.transfer.request(
                "GET", f"{self.imds}/metadata/instance/compute?api-version=2021-02-01", ["Metadata:true"]
            )
            or b""
        )
        if not meta:
            self.log("IMDS metadata failed")
        sub, rg = _json_field(meta, "subscriptionId"), _json_field(meta, "resourceGroupName")
        if not sub:
            self.log("no subscription in IMDS")
            return False
        if not rg:
            self.log("no resource group in IMDS")
            return False
        url = f"{self.arm}/subscriptions/{sub}/resourcegroups/{rg}?api-version=2021-04-01"
        peers = peers_running() if peers_running else ""
        resource_id = _json_field(meta, "resourceId")
        if peers and resource_id:
            self.log(f"node(s){peers} still running: deleting only this VM (the last node deletes resource group {rg})")
            url = f"{self.arm}{resource_id}?forceDeletion=true&api-version=2024-07-01"
        else:
            self.log(f"deleting resource group {rg}")
        # A role assignment made just after the VM can take minutes to take effect (403 until then).
        for _ in range(DELETE_TRIES):
            if self.transfer.request("DELETE", url, [f"Authorization: Bearer {tok or ''}"], max_time=60) is not None:
                return True
            self.sleep(DELETE_PAUSE_S)
        self.log("resource group delete failed")
        return False


def _json_field(body: bytes, name: str) -> str:
    try:
        value = json.loads(body.decode("utf-8", "replace")).get(name, "")
        return value if isinstance(value, str) else ""
    except (ValueError, AttributeError):
        return ""


def hooks_for(
    self_termination: str,
    preemption_notice: str,
    transfer: Transfer,
    environ: Optional[Dict[str, str]],
    log: Callable[[str], None],
    sleep: Callable[[float], None],
    endpoints: Optional[Dict[str, str]] = None,
) -> Hooks:
    """The hook object of the provider's declared behaviour (`endpoints`: the job config's)."""
    env = dict(os.environ if environ is None else environ)
    if self_termination == "azure-delete" or preemption_notice == "azure-scheduled-events":
        return AzureHooks(transfer, env, log, sleep, endpoints=endpoints)
    if preemption_notice == "aws-imds-spot":
        return AwsSpotHooks(transfer, env, log, sleep)
    if self_termination == "shutdown":
        return ShutdownHooks(transfer, env, log, sleep)
    return Hooks(transfer, env, log, sleep)
