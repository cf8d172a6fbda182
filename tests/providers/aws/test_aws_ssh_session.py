"""`gpucloud ssh` on the AWS simulator (moto and the VM simulator): a job with `ports:` gets the run's
key pair (0600 under GPUCLOUD_HOME) and one ingress rule, port 22 from the caller's /32, and every
rule of every security group the run created admits nothing else; the session reaches the node's
public address with that key only; `down` removes the key, the rules and the entries.

How the command reaches "the node": moto's instances have a public address nothing answers on, so a
real sshd of tests/support/sshd.py stands in for the node's, authorising only the public half of
the run's key (what cloud-init installs from the key pair), and the user's ssh_config
(GPUCLOUD_SSH_CONFIG, which the session's config includes first, as a bastion or port of the
user's would be) points the node's entry at it. The entry gpucloud writes names the instance's
real public address; the test reads it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.aws_runs import invoke, plain_cli, run_id_in, write_aws_job  # noqa: F401
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.moto_server import Moto, moto, moto_server  # noqa: F401
from tests.support.polling import wait_until
from tests.support.sessions import hold_forwards, page
from tests.support.sshd import SshLab, free_port, have_sshd

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
    job = write_aws_job(tmp_path / "job.yaml", run="sleep 120", name="awsssh")
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

    lab = SshLab(tmp_path / "lab")  # the node's sshd: it knows the run's public key only
    try:
        node = lab.add_server("node", gpu=("Tesla T4", 1, 15360, "535.104.05", "12.2"))
        pub = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, check=True)
        Path(f"{lab.client_key}.pub").write_text(pub.stdout)
        mine = tmp_path / "user_ssh_config"
        mine.write_text(f"Host gpucloud-*\n  HostName 127.0.0.1\n  Port {node.port}\n  User {lab.user}\n")
        env = {**aws_env, "GPUCLOUD_SSH_CONFIG": str(mine)}
        smi = plain_cli(env, "ssh", run_id, "--", "nvidia-smi", "-L")
        assert smi.returncode == 0 and smi.stdout.startswith("GPU 0: Tesla T4"), smi.stderr
        assert (gpucloud_home / "ssh-config" / f"{run_id}.known_hosts").is_file()  # the run's own, not yours
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
        finally:
            proc.terminate()
            proc.wait(10)
            served.terminate()
            served.wait(10)
    finally:
        lab.close()

    code, out = invoke("down", run_id, "--yes")
    assert code == 0, out[-2000:]
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
