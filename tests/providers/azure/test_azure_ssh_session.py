"""`gpucloud ssh` on the Azure simulator (the fake ARM server, Azurite and the VM simulator): a job
with `ports:` gets a key pair of the run's own (0600 under GPUCLOUD_HOME, its public half the VM's
only authorised key) and one NSG rule, port 22 from the caller's /32, and every rule of every NSG
the run created admits nothing else; the session reaches the node with that key only; `down`
removes the key and the entries.

As on the AWS simulator, the node's public address answers nothing here: the user's ssh_config
(GPUCLOUD_SSH_CONFIG) maps the node's entry to the simulated VM's own sshd
(`azure_sim.sshd_port(vm)`), which admits only the key the VM was given and logs in with the
guest's environment (the size's GPU in `nvidia-smi -L`, the node's job folder, its W/sessions);
the entry gpucloud writes names the node's public address from ARM, which the test reads."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path
from typing import Any

import pytest

from tests.support.azure_fixtures import (  # noqa: F401  (fixtures)
    arm,
    azure_env,
    azurite,
    fake_arm_server,
    leftovers,
    wait_until,
)
from tests.support.azure_runs import write_azure_job
from tests.support.azure_sim import AzureVmSimulator, azure_sim  # noqa: F401
from tests.support.cli import cli
from tests.support.fake_arm import FakeArm
from tests.support.sshd import have_sshd, login_refused
from tests.support.vm_sim import GPU_NAMES, gpu_of

pytestmark = [
    pytest.mark.skipif(not have_sshd(), reason="needs /usr/sbin/sshd and ssh (openssh-server)"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]
CALLER = "203.0.113.7/32"


def run_resources(arm: FakeArm, run_id: str, rtype: str) -> list[dict[str, Any]]:  # noqa: F811
    with arm.lock:
        return [
            json.loads(json.dumps(r.body))
            for r in arm.resources.values()
            if r.type.lower() == rtype.lower() and f"gpucloud-{run_id}-" in r.id
        ]


def test_session_key_and_rule_admit_only_the_caller_and_go_with_down(
    azure_env: dict[str, str],  # noqa: F811
    arm: FakeArm,  # noqa: F811
    azure_sim: AzureVmSimulator,  # noqa: F811
    tmp_path: Path,
    gpucloud_home: Path,
) -> None:
    env = {**azure_env, "GPUCLOUD_SSH_CIDR": CALLER}
    job = write_azure_job(tmp_path / "job.yaml", run="sleep 120", name="azssh")
    job.write_text(job.read_text() + "ports: [8888]\n")  # ports alone ask for the session's key and rule
    proc = cli("run", str(job), "--cloud", "azure", "--detach", "--json", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_id = json.loads(proc.stdout)["run_id"]
    nsgs = run_resources(arm, run_id, "Microsoft.Network/networkSecurityGroups")
    rules = [r["properties"] for n in nsgs for r in n["properties"]["securityRules"]]
    allowed = [r for r in rules if r["direction"] == "Inbound" and r["access"] == "Allow"]
    assert nsgs and [(r["sourceAddressPrefix"], r["destinationPortRange"]) for r in allowed] == [(CALLER, "22")]
    assert all(not r.get("sourceAddressPrefixes") for r in allowed)
    [key] = list((gpucloud_home / "keys").glob(f"gpucloud-{run_id}-*.key"))
    assert key.stat().st_mode & 0o777 == 0o600
    [vm] = run_resources(arm, run_id, "Microsoft.Compute/virtualMachines")
    [authorised] = vm["properties"]["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"]

    entry = cli("ssh", run_id, "--print-config", env=env)
    assert entry.returncode == 0, entry.stderr
    [pip] = run_resources(arm, run_id, "Microsoft.Network/publicIPAddresses")
    assert f"  HostName {pip['properties']['ipAddress']}\n" in entry.stdout
    assert f"  IdentityFile {key}\n" in entry.stdout and "  User gpucloud\n" in entry.stdout

    # The node's own sshd (the simulator's, for this VM's guest): it admits the key the VM was
    # given only; the user's ssh_config maps the node's entry to its port.
    guest = azure_sim.guest(vm["id"])
    assert guest is not None and guest.ssh_key == authorised["keyData"]
    mine = tmp_path / "user_ssh_config"
    user = pwd.getpwuid(os.getuid()).pw_name
    mine.write_text(f"Host gpucloud-*\n  HostName 127.0.0.1\n  Port {azure_sim.sshd_port(vm['id'])}\n  User {user}\n")
    node_env = {**env, "GPUCLOUD_SSH_CONFIG": str(mine)}
    assert wait_until(lambda: "stage run" in guest.console(), timeout=30), guest.console()  # its driver is in
    gpu, count = gpu_of("azure", vm["properties"]["hardwareProfile"]["vmSize"])
    smi = cli("ssh", run_id, "--", "nvidia-smi", "-L", env=node_env)
    assert smi.returncode == 0, smi.stderr
    assert [line.split(" (")[0] for line in smi.stdout.splitlines()] == [
        f"GPU {i}: {GPU_NAMES[gpu]}" for i in range(count)
    ], smi.stdout
    where = cli("ssh", run_id, "--", "pwd; echo $GPUCLOUD_VM_DIR; ls $GPUCLOUD_VM_DIR/sessions; echo $$", env=node_env)
    assert where.returncode == 0, where.stderr
    lines = where.stdout.splitlines()
    assert lines[:2] == [str(guest.sandbox / "vm" / "job"), str(guest.sandbox / "vm")], lines
    assert f"ssh-{lines[-1]}" in lines[2:-1], lines  # registered where a kept machine's idle clock looks
    assert login_refused(guest.sshd.port if guest.sshd else 0, tmp_path / "other")  # no key but the VM's

    down = cli("down", run_id, "--yes", env=env)
    assert down.returncode == 0, down.stderr
    assert not key.exists() and list((gpucloud_home / "ssh-config").glob(f"{run_id}*")) == []
    assert wait_until(lambda: leftovers(arm) == [], timeout=60)
    assert wait_until(lambda: guest.sshd is not None and not guest.sshd.alive(), timeout=10)
