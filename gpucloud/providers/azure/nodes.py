"""An attempt's nodes: per node a public IP, a NIC, the VM (plus a driver extension on GRID
images), its self-delete role assignment and its channel access (node_access.py), each node in a
thread of its own (ARM has no call that creates N VMs at once, short of a scale set). The first
failure stops the other threads at their next step, so no creation lands after the attempt's
cleanup."""

from __future__ import annotations

import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpucloud.contract.provider import LaunchRequest, ProvisionError
from gpucloud.providers.azure.arm import Arm, tracked
from gpucloud.providers.azure.machine import driver_extension_body, nic_body, pip_body, vm_body
from gpucloud.providers.azure.node_access import grant_channel_access, sas_only_warning
from gpucloud.providers.azure.roles import grant_self_delete

if TYPE_CHECKING:
    from gpucloud.contract.provider import Journal

# Nodes whose resources are created at the same time (ARM's write limits are per subscription).
MAX_PARALLEL_NODES = 16
# How often a node's thread looks up from a long-running operation to see whether to give up.
ABORT_CHECK_S = 0.25


class Aborted(Exception):
    """A node's thread stopped because another node of the attempt failed (or Ctrl-C)."""


class NodeFailed(Exception):
    """The first failure among a multi-node attempt's node threads: which step, and the cause."""

    def __init__(self, rank: int, step: str, cause: Exception) -> None:
        super().__init__(f"node {rank}: {step}: {cause}")
        self.rank, self.step, self.cause = rank, step, cause


def _check(abort: threading.Event) -> None:
    if abort.is_set():
        raise Aborted()


def _await(poller: Any, abort: threading.Event) -> Any:
    """A long-running operation's result, unless `abort` is set first (then `Aborted`; the
    operation goes on in Azure and ends with the resource group)."""
    while not poller.done():
        _check(abort)
        poller.wait(ABORT_CHECK_S)
    return poller.result()


@dataclass
class NodeNetwork:
    """The shared resources every node of the attempt joins (network.py created them)."""

    rg: str
    subnet_id: str
    nsg_id: str
    ppg_id: str | None
    avset_id: str | None = None  # InfiniBand sizes: the availability set RDMA needs
    channel_access: bool = False  # each VM's identity gets its run's blobs (node_access.py)


@dataclass
class _Attempt:
    """One attempt's node threads: what they share, the abort flag and the failures they report."""

    arm: Arm
    req: LaunchRequest
    journal: Journal
    net: NodeNetwork
    tags: dict[str, str]
    ssh_key: str
    abort: threading.Event = field(default_factory=threading.Event)
    failures: list[NodeFailed] = field(default_factory=list)
    sas_only: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # why -> (rank, VM) kept SAS URLs
    lock: threading.Lock = field(default_factory=threading.Lock)

    def node(self, rank: int) -> str:
        """One node's resources in order; returns the VM id. A failure sets `abort` for the others."""
        from azure.core.exceptions import AzureError

        step = f"creating the public IP of node {rank}"
        try:
            pip_id = self._public_ip(rank)
            step = f"creating the network interface of node {rank}"
            nic_id = self._nic(rank, pip_id)
            step = f"creating VM {rank} ({self.req.instance_type})"
            vm = self._vm(rank, nic_id)
            extension = self.req.image.extension if self.req.image else ""
            if extension:  # GRID VMs: the driver comes from the cloud's extension (docs/STACKS.md)
                step = f"adding the {extension} driver extension to VM {rank}"
                self._driver_extension(rank, extension)
            step = f"granting VM {rank} the right to delete its resource group"
            grant_self_delete(
                self.arm, self.journal, self.req.run_id, self.req.region, self.net.rg, vm, pause=self._pause
            )
            if self.net.channel_access:
                step = f"granting VM {rank} its run's blobs"
                why = grant_channel_access(
                    self.arm, self.journal, self.req.run_id, self.req.region, vm, pause=self._pause
                )
                if why:
                    with self.lock:
                        self.sas_only.setdefault(why, []).append((rank, str(vm.name)))
            return str(vm.id)
        except Aborted:
            raise
        except (AzureError, ProvisionError) as exc:
            with self.lock:
                self.failures.append(NodeFailed(rank, step, exc))
            self.abort.set()
            raise
        except BaseException:
            self.abort.set()
            raise

    def _pause(self, delay: float) -> None:
        """Wait between role-assignment retries, unless another node failed meanwhile."""
        if self.abort.wait(delay):
            raise Aborted() from None

    def _public_ip(self, rank: int) -> str:
        def create() -> Any:
            ips = self.arm.network.public_ip_addresses
            return _await(
                ips.begin_create_or_update(self.net.rg, f"pip-{rank}", pip_body(self.req, self.tags)), self.abort
            )

        pip_id: str = self._tracked("public_ip", f"pip-{rank}", lambda: create().id)
        return pip_id

    def _nic(self, rank: int, pip_id: str) -> str:
        def create() -> Any:
            body = nic_body(self.req, self.tags, self.net.nsg_id, self.net.subnet_id, pip_id)
            return _await(
                self.arm.network.network_interfaces.begin_create_or_update(self.net.rg, f"nic-{rank}", body), self.abort
            )

        nic_id: str = self._tracked("nic", f"nic-{rank}", lambda: create().id)
        return nic_id

    def _vm(self, rank: int, nic_id: str) -> Any:
        """The VM (not begun once another node failed: a VM is the slow, billed part)."""
        req = self.req
        _check(self.abort)
        net = self.net
        body = vm_body(
            req, rank, req.user_data[rank], nic_id, req.region, self.tags, self.ssh_key, net.ppg_id, net.avset_id
        )
        res_id = self.journal.intent(req.run_id, "vm", f"node-{rank}", req.region, self.arm.name)
        vm = _await(
            self.arm.compute.virtual_machines.begin_create_or_update(self.net.rg, f"node-{rank}", body), self.abort
        )
        self.journal.created(res_id, vm.id)
        return vm

    def _driver_extension(self, rank: int, extension: str) -> None:
        body = driver_extension_body(self.req.region, extension, self.tags, self.req.instance_type)
        _await(
            self.arm.compute.virtual_machine_extensions.begin_create_or_update(
                self.net.rg, f"node-{rank}", extension, body
            ),
            self.abort,
        )

    def _tracked(self, kind: str, name: str, create: Any) -> Any:
        return tracked(self.arm, self.journal, self.req.run_id, self.req.region, kind, name, create)


def create_nodes(
    arm: Arm, req: LaunchRequest, journal: Journal, net: NodeNetwork, tags: dict[str, str], ssh_key: str
) -> list[str]:
    """Every node's public IP, NIC, VM and role assignment, one thread per node. The first
    failure stops the other threads at their next step (a VM still being created is left to
    the group's deletion) and is raised as `NodeFailed` once every thread has stopped, so no
    creation lands after the cleanup. Returns the VM ids in rank order."""
    attempt = _Attempt(arm, req, journal, net, tags, ssh_key)
    n = len(req.user_data)
    pool = ThreadPoolExecutor(max_workers=min(n, MAX_PARALLEL_NODES), thread_name_prefix=f"azure-{req.run_id}")
    futures = [pool.submit(attempt.node, rank) for rank in range(n)]
    try:
        wait(futures, return_when=FIRST_EXCEPTION)
        if any(f.done() and f.exception() is not None for f in futures):
            attempt.abort.set()
        wait(futures)
    except BaseException:  # Ctrl-C in this thread: stop the nodes' threads before the lifecycle tears down
        attempt.abort.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    for why, vms in attempt.sas_only.items():
        journal.event(req.run_id, "warning", sas_only_warning([name for _, name in sorted(vms)], why))
    if attempt.failures:
        raise attempt.failures[0]
    for f in futures:
        exc = f.exception()
        if exc is not None and not isinstance(exc, Aborted):
            raise exc
    return [f.result() for f in futures]
