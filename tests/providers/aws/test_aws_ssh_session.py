"""`gpucloud ssh` on the AWS simulator (moto and the VM simulator): a job with `ports:` gets the run's
key pair (0600 under GPUCLOUD_HOME) and one ingress rule, port 22 from the caller's /32, and every
rule of every security group the run created admits nothing else; the session reaches the node's
public address with that key only; `down` removes the key, the rules and the entries.

How the command reaches the node: moto's instances have a public address nothing answers on, so
the user's ssh_config (GPUCLOUD_SSH_CONFIG, which the session's config includes first, as a bastion
or port of the user's would be) maps the node's entry to the simulated node's own sshd
(`aws_sim.sshd_port(instance)`), which admits only the public half of the instance's key pair (what
cloud-init installs) and logs in with the guest's environment: `nvidia-smi -L` names the catalog's
GPU of the instance type the run got, the shell starts in the node's job folder and registers in its
W/sessions (what holds a kept machine). The entry gpucloud writes names the instance's
real public address; the test reads it."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from gpucloud.vm.agent.keep import live_sessions
from tests.support.aws_runs import invoke, plain_cli, run_id_in, write_aws_job  # noqa: F401
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.moto_server import Moto, moto, moto_server  # noqa: F401
from tests.support.polling import wait_until
from tests.support.sessions import hold_forwards, page
from tests.support.sshd import free_port, have_sshd, login_refused
from tests.support.vm_sim import GPU_NAMES, gpu_of

pytestmark = pytest.mark.skipif(not have_sshd(), reason="needs /usr/sbin/sshd and ssh (openssh-server)")
CALLER = "203.0.113.7/32"  # aws_env's GPUCLOUD_SSH_CIDR


def run_rules(moto: Moto, run_id: str) -> list[tuple[str, dict]]:  # noqa: F811
    """Every ingress permission of every security group tagged with the run."""
    ec2 = moto.client("ec2", "us-east-1")
    groups = ec2.describe_security_groups(Filters=[{"Name": "tag:gpucloud-run", "Values": [run_id]}])
    return [(g["GroupId"], p) for g in groups["SecurityGroups"] for p in g.get("IpPermissions", [])]


def admits_only_the_caller(group: str, perm: dict) -> bool:
    """A rule admits the caller's /32 and nothing else (its own group: the run's other nodes)."""
    pairs = {p["GroupId"] for p in perm.get("UserIdGroupPairs", [])}
    cidrs = {r["CidrIp"] for r in perm.get("IpRanges", [])}
    return (
        cidrs <= {CALLER}
        and not perm.get("Ipv6Ranges")
        and not perm.get("PrefixListIds")
        and pairs <= {group}
        and bool(cidrs or pairs)
    )


def test_session_key_and_rule_admit_only_the_caller_and_go_with_down(
    inproc: None,
    aws_env: dict[str, str],
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    tmp_path: Path,
    gpucloud_home: Path,
) -> None:
    port = free_port()
    job = write_aws_job(tmp_path / "job.yaml", run="sleep 120", name="awsssh", gpu="A10G:1")
    job.write_text(job.read_text() + f"ports: [{port}]\n")  # ports alone ask for the session's key and rule
    code, out = invoke("run", str(job), "--cloud", "aws", "--detach", "--yes")
    assert code == 0, out[-2000:]
    run_id = run_id_in(out)
    rules = run_rules(moto, run_id)
    assert any(p.get("FromPort") == 22 and p.get("ToPort") == 22 for _, p in rules), rules
    assert all(admits_only_the_caller(g, p) for g, p in rules), rules
    [key] = list((gpucloud_home / "keys").glob(f"gpucloud-{run_id}-*.pem"))
    assert key.stat().st_mode & 0o777 == 0o600

    entry = plain_cli(aws_env, "ssh", run_id, "--print-config")
    assert entry.returncode == 0, entry.stderr
    instance = moto.client("ec2", "us-east-1").describe_instances(
        Filters=[{"Name": "tag:gpucloud-run", "Values": [run_id]}]
    )["Reservations"][0]["Instances"][0]
    assert f"  HostName {instance['PublicIpAddress']}\n" in entry.stdout
    assert f"  IdentityFile {key}\n" in entry.stdout and "  User ubuntu\n" in entry.stdout

    # The node's own sshd (the simulator's, for the guest of this instance): it admits the public
    # half of the run's key pair only; the user's ssh_config maps the node's entry to its port.
    iid = instance["InstanceId"]
    mine = tmp_path / "user_ssh_config"
    user = pwd.getpwuid(os.getuid()).pw_name
    mine.write_text(f"Host gpucloud-*\n  HostName 127.0.0.1\n  Port {aws_sim.sshd_port(iid)}\n  User {user}\n")
    env = {**aws_env, "GPUCLOUD_SSH_CONFIG": str(mine)}
    guest = aws_sim.guest(iid)
    assert guest is not None
    node_dir = guest.sandbox / "vm"
    assert wait_until(lambda: "stage run" in guest.console(), 30), guest.console()  # its driver is in
    gpu, count = gpu_of("aws", instance["InstanceType"])
    smi = plain_cli(env, "ssh", run_id, "--", "nvidia-smi", "-L")
    assert smi.returncode == 0, smi.stderr
    assert [line.split(" (")[0] for line in smi.stdout.splitlines()] == [
        f"GPU {i}: {GPU_NAMES[gpu]}" for i in range(count)
    ], smi.stdout
    assert (gpucloud_home / "ssh-config" / f"{run_id}.known_hosts").is_file()  # the run's own, not yours
    # The session is on the node: it starts in the node's job folder with the node's environment,
    # and its shell registers in the node's W/sessions (what holds a kept machine).
    where = plain_cli(
        env, "ssh", run_id, "--", "pwd; echo $GPUCLOUD_VM_DIR $STUB_GPU_NAME; ls $GPUCLOUD_VM_DIR/sessions; echo $$"
    )
    assert where.returncode == 0, where.stderr
    lines = where.stdout.splitlines()
    assert lines[0] == str(node_dir / "job") and lines[1] == f"{node_dir} {GPU_NAMES[gpu]}", lines
    assert f"ssh-{lines[-1]}" in lines[2:-1], lines
    (tmp_path / "index.html").write_text("page from the aws node\n")
    served = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proc, found = hold_forwards(env, run_id)
    try:
        assert int(found.group(1)) == port and int(found.group(3)) != port, found
        assert wait_until(lambda: page(found.group(2) + "index.html") == "page from the aws node\n", 30)
        assert wait_until(lambda: live_sessions(node_dir) == 1, 10)  # the kept-machine idle clock sees it
    finally:
        proc.terminate()
        proc.wait(10)
        served.terminate()
        served.wait(10)
    assert guest.sshd is not None and guest.sshd.accepted() >= 3
    assert login_refused(guest.sshd.port, tmp_path / "other")  # no key but the run's

    code, out = invoke("down", run_id, "--yes")
    assert code == 0, out[-2000:]
    # the node's sshd and every process of its sessions end with the machine
    assert wait_until(lambda: guest.sshd is not None and not guest.sshd.alive() and not guest.vm.leftovers(), 10)
    assert not key.exists() and run_rules(moto, run_id) == []
    assert list((gpucloud_home / "ssh-config").glob(f"{run_id}*")) == []
    gone = plain_cli(aws_env, "ssh", run_id, "--", "true")
    assert gone.returncode == 2, gone.stderr


def test_a_run_without_ssh_or_ports_has_no_session_path(
    inproc: None,
    aws_env: dict[str, str],
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    tmp_path: Path,
) -> None:
    code, out = invoke("run", str(write_aws_job(tmp_path / "j.yaml", run="sleep 60", name="nossh")), "--detach")
    assert code == 0, out[-2000:]
    run_id = run_id_in(out)
    try:
        assert run_rules(moto, run_id) == []  # no inbound rule at all
        res = plain_cli(aws_env, "ssh", run_id, "--", "true")
        assert res.returncode == 78 and "resources.ssh: true" in " ".join(res.stderr.split()), res.stderr
    finally:
        invoke("down", run_id, "--yes")
