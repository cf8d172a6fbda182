"""`gpucloud ssh` to a real booted guest by the product's own AWS path (gpucloud/run/session.py,
gpucloud/providers/aws/ssh_session.py): the run's record names an AWS attempt whose instance is a
moto instance launched with the run's key pair, the key file sits where the AWS provider keeps it
(0600 under GPUCLOUD_HOME/keys), and the guest got that key's public half from its metadata service
as an EC2 instance launched with that KeyName does.

What is played: EC2 (moto answers DescribeInstances with the instance's state and a public address
nothing answers on) and the user's ssh_config (GPUCLOUD_SSH_CONFIG maps this run's node entry to
the host port qemu forwards to the guest's :22, as a bastion or port of the user's would). What is
real: the CLI, the session's ssh config and known_hosts, ssh, the guest's sshd, the login user
cloud-init made with the key it installed, and the stand-in nvidia-smi the stack stage installed.
The record is written here rather than by a `gpucloud run` (the guest's run is rendered by
tests/support/guest_runs.py against a file channel, not launched through moto), held by this
process's pid so no CLI reads the run's channel to refresh it.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpucloud.contract.provider import RunHandle
from gpucloud.state.runs_db import Store
from tests.support.aws_runs import plain_cli
from tests.support.cli import REPO
from tests.support.moto_server import Moto

CLOUD, REGION, INSTANCE_TYPE = "aws", "us-east-1", "g4dn.xlarge"
KEY_KIND = "key-pair"  # the AWS handle's resource kind of the run's key pair


def session_key(folder: Path) -> tuple[Path, str]:
    """A new ed25519 key (as the AWS provider makes one per run): its private file and public line."""
    folder.mkdir(parents=True, exist_ok=True)
    key = folder / "session"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpucloud-guest", "-f", str(key)], check=True)
    return key, key.with_suffix(".pub").read_text().strip()


@dataclass
class SessionRun:
    """The recorded run: its id, the moto instance, and the environment a CLI subprocess needs."""

    run_id: str
    instance_id: str
    key_name: str
    env: dict[str, str]
    moto: Moto

    def ssh(self, *command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """`gpucloud ssh RUN -- COMMAND` in a CLI subprocess."""
        return plain_cli(self.env, "ssh", self.run_id, "--", *command, timeout=timeout)

    def end(self) -> None:
        """Terminate the instance and delete the key pair: nothing tagged stays for the worker's next file."""
        ec2 = self.moto.client("ec2", REGION)
        ec2.terminate_instances(InstanceIds=[self.instance_id])
        ec2.delete_key_pair(KeyName=self.key_name)


def record_aws_run(moto: Moto, home: Path, run_id: str, key: Path, public: str, ssh_port: int) -> SessionRun:
    """Launch the moto instance with the run's key pair, put the key where the AWS provider keeps it,
    record the running run, and write the user's ssh_config mapping the node's entry to `ssh_port`."""
    ec2 = moto.client("ec2", REGION)
    key_name = f"gpucloud-{run_id}-{REGION}-0"
    ec2.import_key_pair(KeyName=key_name, PublicKeyMaterial=public.encode())
    ami = ec2.describe_images()["Images"][0]["ImageId"]
    tags = [{"ResourceType": "instance", "Tags": [{"Key": "gpucloud-run", "Value": run_id}]}]
    out = ec2.run_instances(
        ImageId=ami, InstanceType=INSTANCE_TYPE, MinCount=1, MaxCount=1, KeyName=key_name, TagSpecifications=tags
    )
    instance = out["Instances"][0]["InstanceId"]
    keys = home / "keys"
    keys.mkdir(mode=0o700, exist_ok=True)
    own = keys / f"{key_name}.pem"
    fd = os.open(own, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key.read_bytes())
    store = Store()
    store.create_run(
        run_id, name="guest", cloud=CLOUD, region=REGION, instance_type=INSTANCE_TYPE, pid=os.getpid(), status="running"
    )
    store.start_attempt(
        run_id, 0, cloud=CLOUD, region=REGION, instance_type=INSTANCE_TYPE, spot=False, price_per_hour=0.5, num_nodes=1
    )
    handle = RunHandle(run_id=run_id, cloud=CLOUD, region=REGION, nodes=[instance], resources={KEY_KIND: [key_name]})
    store.set_attempt_handle(run_id, 0, handle.to_json())
    store.close()
    user_config = home / "user_ssh_config"
    user_config.write_text(f"Host gpucloud-{run_id}-0\n  HostName 127.0.0.1\n  Port {ssh_port}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUCLOUD_TEST_", "AZURE_"))}
    env.update(moto.env)
    env.update({"GPUCLOUD_HOME": str(home), "CI": "true", "PYTHONPATH": str(REPO)})
    env["GPUCLOUD_SSH_CONFIG"] = str(user_config)
    return SessionRun(run_id, instance, key_name, env, moto)
