"""`gpucloud ssh` on AWS: real ssh to the node's public address with the run's own key pair, through
the one ingress rule the run has, port 22 from the caller's address /32 (network.py `ssh_access`,
made at launch for a job with `resources.ssh: true` or `ports:`). A run launched without them has
neither the key on its nodes nor the rule, and says so rather than opening anything afterwards."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from gpucloud.contract.provider import Capabilities, RunHandle
from gpucloud.contract.session import CloudNode, SessionAsk, SessionPlan, cloud_session, unsupported
from gpucloud.errors import UserError
from gpucloud.providers.aws.network import CLOUD, KEY


class NodeLookup(Protocol):
    """What a session needs of the provider (AwsProvider): the run's key file and EC2."""

    capabilities: Capabilities

    def key_path(self, run_id: str, region: str, attempt: int) -> Path: ...

    def ec2(self, op: str, region: str, **kwargs: Any) -> Any: ...


LOGIN_USER = "ubuntu"  # Canonical's images and the Deep Learning AMIs on Ubuntu


def aws_session(aws: NodeLookup, handle: RunHandle, rank: int, ask: SessionAsk) -> SessionPlan:
    """The node's address from EC2, the run's key file, then ssh (contract/session.py)."""
    key = aws.key_path(handle.run_id, handle.region, handle.attempt)
    if not handle.resources.get(KEY) or not key.is_file():
        raise unsupported(
            CLOUD,
            f"run {handle.run_id} was launched without `resources.ssh: true` (or `ports:`), so its nodes have "
            "neither the run's key nor a rule admitting you; gpucloud does not open one afterwards",
        )
    if rank >= len(handle.nodes):
        raise UserError(f"run {handle.run_id} has node(s) 0..{len(handle.nodes) - 1}.")
    out = aws.ec2("describe_instances", handle.region, InstanceIds=[handle.nodes[rank]])
    found = [i for r in out.get("Reservations", []) for i in r.get("Instances", [])]
    state = found[0].get("State", {}).get("Name", "gone") if found else "gone"
    address = found[0].get("PublicIpAddress", "") if found else ""
    if state != "running" or not address:
        raise UserError(
            f"node {rank} of run {handle.run_id} ({handle.nodes[rank]}) is {state}"
            + ("" if address or state != "running" else " and has no public address")
            + ": there is nothing to open a session on."
        )
    node = CloudNode(handle.run_id, rank, address, LOGIN_USER, key, aws.capabilities.vm_dir)
    return cloud_session(node, ask)
