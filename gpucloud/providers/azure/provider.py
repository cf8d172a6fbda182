"""Azure: one resource group per run and attempt, holding everything the run's VMs need.

Why one resource group: it is Azure's unit of deletion. Tearing a run down is one long-running
DELETE, a crash leaves one tagged group for `gc` to find, and the VM itself can delete it through
its managed identity when the job ends or the deadline passes (a shutdown inside the guest leaves
the VM "Stopped (allocated)" and billed: docs/PROVIDERS.md, "Azure self-delete").

Per run and region the group holds a VNet with one subnet, an NSG that denies all inbound traffic
(SSH from the caller's address only when the job asks for it; for a multi-node job, everything
from the run's own subnet, i.e. its own nodes), and per node a Standard static public IP (outbound
access: new VNets have no default outbound since Sep 2025), a NIC and the VM. A multi-node job's
VMs share a proximity placement group (one datacenter, low latency between nodes) and, on
InfiniBand sizes, an availability set (RDMA between VMs needs one: sizes.py) in the same group, so
they go when the group goes. NICs get accelerated networking where the size supports it, and every
VM an explicit security type (Trusted Launch with Secure Boot off, or Standard: sizes.py). ARM
has no call that creates N VMs at once (short of a scale set), so each node's public IP, NIC, VM
and role assignment are created by a thread of its own, in parallel; the shared resources (group,
NSG, VNet, placement group, availability set) are created once.
Each VM gets a system-assigned identity with the built-in Contributor role on its own group only:
enough to delete the group, nothing outside it, and Contributor cannot grant roles. (A custom role
with just the delete actions would be narrower, but creating role definitions needs rights at the
subscription scope on every user's account; the blast radius here is already the run's own group.)

Endpoints: `GPUCLOUD_AZURE_ARM_ENDPOINT` (ARM base URL; default the cloud the CLI is configured
for, access.arm_endpoint, which the nodes' self-delete also uses) and
`GPUCLOUD_AZURE_BLOB_ENDPOINT` (see channel.py). Credentials: `DefaultAzureCredential` and
`AZURE_SUBSCRIPTION_ID`, or `credential=` / `subscription_id=` when embedding. The azure SDKs are
imported inside methods so that `gpucloud --help` stays fast.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpucloud.contract.provider import (
    DEFAULT_MASTER_PORT,
    TAG_EXPIRES,
    TAG_RUN,
    Capabilities,
    FatalProvisionError,
    LaunchRequest,
    Provider,
    ProvisionError,
    RunHandle,
    expiry_tag,
)
from gpucloud.errors import CloudAccessError, GpucloudError
from gpucloud.providers.azure.access import arm_endpoint as arm_endpoint_of_cli
from gpucloud.providers.azure.access import (
    default_credential,
    no_subscription,
    pipeline_kwargs,
)
from gpucloud.providers.azure.errors import classify_error, error_parts
from gpucloud.providers.azure.machine import (
    nsg_body,
    throwaway_ssh_key,
    vm_state,
)
from gpucloud.providers.azure.network import (
    create_availability_set,
    create_group,
    create_nsg,
    create_placement_group,
    create_vnet,
)
from gpucloud.providers.azure.nodes import NodeFailed, NodeNetwork, create_nodes
from gpucloud.providers.azure.sizes import rdma_placement
from gpucloud.providers.azure.ssh_session import azure_session, forget_keys, make_run_key, run_key_path

if TYPE_CHECKING:
    from gpucloud.contract.provider import Candidate, Journal, PlanRequest
    from gpucloud.contract.session import SessionAsk, SessionPlan
    from gpucloud.providers.azure.channel import BlobChannel

BLOB_ENDPOINT_ENV = "GPUCLOUD_AZURE_BLOB_ENDPOINT"
# When the server gives no Retry-After, poll long-running operations this often (SDK default: 30 s).
DEFAULT_POLL_SECONDS = 5.0
RG, VM = "resource-group", "vm"  # RunHandle resource kinds


def resource_group_name(run_id: str, region: str, attempt: int = 0) -> str:
    """One group per run, region and attempt: a later attempt never collides with a group of the
    same run that is still being deleted (a failed attempt's deletion is begun, not waited for; a
    group's location is fixed). The first attempt keeps the short name. The attempt suffix comes
    first, so cutting a long name at 90 characters keeps it."""
    suffix = f"-a{attempt}" if attempt else ""
    return f"gpucloud-{run_id}-{region}"[: 90 - len(suffix)] + suffix


def _allow_http_policy() -> Any:
    """A per-call policy that lets the bearer-token policy send tokens to an http:// endpoint
    (an emulator or a local proxy named by GPUCLOUD_AZURE_ARM_ENDPOINT)."""
    from azure.core.pipeline.policies import SansIOHTTPPolicy

    class AllowHttp(SansIOHTTPPolicy):
        def on_request(self, request: Any) -> None:
            request.context.options["enforce_https"] = False

    return AllowHttp()


def _teardown_error(exc: Exception, what: str, run_id: str, when: str) -> GpucloudError:
    code, message, status = error_parts(exc)
    return GpucloudError(
        f"could not delete {what}: {code or status} {message}".strip(),
        hint=f"Retry with `gpucloud down {run_id}`; `gpucloud gc` also deletes it once {when}.",
    )


class AzureProvider(Provider):
    """The Azure implementation of the Provider protocol (contract/provider.py)."""

    name = "azure"
    capabilities = Capabilities(
        # Blob GETs are cheap, and a short interval keeps the streamed log responsive.
        poll_interval=2.0,
        shared_user_data=False,  # one VM per node: each boots its own rank's script
        user_data_limit=64 * 1024,
        user_data_encoding="base64",  # docs/PROVIDERS.md, "User data"
        self_termination="azure-delete",  # a guest shutdown leaves the VM allocated and billed
        spot=True,
        multi_node=True,
        preemption_notice="azure-scheduled-events",
        preemption_grace=10.0,  # Scheduled Events gives ~30 s: most of it for the checkpoint upload
        console_hint="its boot log: az vm boot-diagnostics get-boot-log -g gpucloud-{run_id}-{region} -n node-{rank} "
        "(until the run is torn down)",
    )

    def __init__(
        self,
        *,
        credential: Any = None,
        subscription_id: str | None = None,
        arm_endpoint: str | None = None,
        blob_endpoint: str | None = None,
    ) -> None:
        self._credential = credential
        self._subscription_id = subscription_id
        self.arm_endpoint = (arm_endpoint or arm_endpoint_of_cli()).rstrip("/")
        # The nodes' self-delete calls this cloud's ARM with a token for its audience, not the public cloud's.
        self.capabilities = dataclasses.replace(
            type(self).capabilities,
            node_endpoints=(("arm", self.arm_endpoint), ("arm_audience", f"{self.arm_endpoint}/")),
        )
        self.blob_endpoint = blob_endpoint or os.environ.get(BLOB_ENDPOINT_ENV) or None
        self._clients: dict[str, Any] = {}
        self._channels: dict[str, BlobChannel] = {}
        self._lock = threading.Lock()

    # ---- clients ----------------------------------------------------------------------------
    @property
    def subscription_id(self) -> str:
        sub = self._subscription_id or os.environ.get("AZURE_SUBSCRIPTION_ID")
        if not sub:
            raise no_subscription()
        return sub

    def credential(self) -> Any:
        if self._credential is None:
            self._credential = default_credential()
        return self._credential

    def _client_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "base_url": self.arm_endpoint,
            "credential_scopes": [f"{self.arm_endpoint}/.default"],
            "polling_interval": DEFAULT_POLL_SECONDS,
            **pipeline_kwargs(),
        }
        if self.arm_endpoint.lower().startswith("http://"):
            kw["per_call_policies"] = [_allow_http_policy()]
        return kw

    def _client(self, kind: str) -> Any:
        with self._lock:
            if kind not in self._clients:
                cls: Any
                if kind == "resource":
                    from azure.mgmt.resource.resources import ResourceManagementClient as cls
                elif kind == "network":
                    from azure.mgmt.network import NetworkManagementClient as cls
                else:
                    from azure.mgmt.compute import ComputeManagementClient as cls
                self._clients[kind] = cls(self.credential(), self.subscription_id, **self._client_kwargs())
            return self._clients[kind]

    @property
    def resource(self) -> Any:
        return self._client("resource")

    @property
    def network(self) -> Any:
        return self._client("network")

    @property
    def compute(self) -> Any:
        return self._client("compute")

    # ---- channel ------------------------------------------------------------------------------
    def channel(self, region: str) -> BlobChannel:
        """The region's Blob channel (storage account and container created on first use)."""
        from azure.core.exceptions import AzureError

        from gpucloud.providers.azure.channel import BlobChannel

        if region not in self._channels:
            try:
                self._channels[region] = BlobChannel.for_region(
                    self.resource,
                    subscription_id=self.subscription_id,
                    region=region,
                    blob_endpoint=self.blob_endpoint,
                    credential=self.credential(),
                )
            except AzureError as exc:
                raise classify_error(exc, where=f"preparing the storage account in {region}", region=region) from None
        return self._channels[region]

    # ---- provision ----------------------------------------------------------------------------
    def master_port(self) -> int:
        return DEFAULT_MASTER_PORT

    def plan_candidates(self, job: PlanRequest) -> list[Candidate]:
        """None of its own: a priced cloud's candidates come from the catalog (planner.py)."""
        return []

    def provision(self, req: LaunchRequest, journal: Journal) -> RunHandle:
        """Create the run's group, network, placement group (multi-node) and VMs (in parallel);
        on any failure, of any node, delete the group, then raise."""
        from azure.core.exceptions import AzureError

        region = req.region
        rg = resource_group_name(req.run_id, region, req.attempt)
        handle = RunHandle(run_id=req.run_id, cloud=self.name, region=region, attempt=req.attempt)
        handle.add(RG, rg)
        tags = {**req.tags, TAG_RUN: req.run_id, TAG_EXPIRES: expiry_tag(req.expires_at)}
        tags.setdefault("Name", f"gpucloud-{req.job_name}")
        # Everything that can fail without touching the cloud comes first.
        self._check_user_data(req)
        self._check_disk(req)
        ssh_key = make_run_key(run_key_path(req.run_id, region, req.attempt)) if req.ssh else throwaway_ssh_key()
        nsg = nsg_body(req, region, tags)
        step = "creating the resource group"
        try:
            create_group(self, journal, req, rg, tags)
            step = "creating the network security group"
            nsg_id = create_nsg(self, journal, req, rg, nsg)
            step = "creating the virtual network"
            subnet_id = create_vnet(self, journal, req, rg, tags, nsg_id)
            ppg_id = avset_id = None
            if len(req.user_data) > 1:
                step = "creating the proximity placement group"
                ppg_id = create_placement_group(self, journal, req, rg, tags)
                if rdma_placement(req.instance_type, req.spot):
                    step = "creating the availability set"
                    avset_id = create_availability_set(self, journal, req, rg, tags, ppg_id)
            # The channel's container exists once this provider has prepared it (the run's manifests).
            net = NodeNetwork(rg, subnet_id, nsg_id, ppg_id, avset_id, channel_access=region in self._channels)
            handle.nodes = create_nodes(self, req, journal, net, tags, ssh_key)
            for rank in range(len(handle.nodes)):
                handle.add(VM, f"node-{rank}")
            return handle
        except (AzureError, ProvisionError, NodeFailed) as exc:
            raise self._provision_failed(exc, step, req, handle, journal) from None

    def _check_disk(self, req: LaunchRequest) -> None:
        """The OS disk is not below the image's (disk.py): the one read before the first create."""
        from gpucloud.providers.azure.disk import check_disk
        from gpucloud.providers.azure.machine import image_reference

        image = image_reference(req.image_ref, req.ubuntu, req.instance_type, req.gpu, req.image)
        check_disk(self.compute, req.region, image, int(req.disk_gb))

    def _check_user_data(self, req: LaunchRequest) -> None:
        """Every node's bootstrap fits Azure's custom-data limit once base64-encoded."""
        from gpucloud.contract.provider import user_data_size

        limit = self.capabilities.user_data_limit or 0
        for rank, script in enumerate(req.user_data):
            size = user_data_size(script, self.capabilities)
            if size > limit:
                raise FatalProvisionError(
                    f"the bootstrap of node {rank} is {size // 1024} KB in base64; Azure custom data is limited "
                    f"to {limit // 1024} KB.",
                    code="CustomDataTooLarge",
                )

    def _provision_failed(
        self, exc: Exception, step: str, req: LaunchRequest, handle: RunHandle, journal: Journal
    ) -> ProvisionError:
        """The attempt's error, classified, after beginning to delete whatever it created."""
        region = req.region
        cause: Exception = exc
        if isinstance(exc, NodeFailed):  # any node's failure fails the whole attempt
            step, cause = exc.step, exc.cause
        error = classify_error(cause, where=step, instance_type=req.instance_type, region=region)
        made = any(r.cloud == self.name and r.region == region and r.cloud_id for r in journal.resources(req.run_id))
        if made or not isinstance(error, CloudAccessError):  # no credentials: nothing was created
            self._cleanup_after_failure(handle, journal)
        return error

    def _cleanup_after_failure(self, handle: RunHandle, journal: Journal) -> None:
        """Begin deleting what the failed attempt made and move on (deleting a group takes minutes on
        Azure); the journal keeps its rows until a later teardown sees the group gone. If even the
        begin fails, teardown/gc will find the tags."""
        try:
            self.teardown(handle, journal, wait=False)
        except GpucloudError as exc:
            journal.event(handle.run_id, "cleanup-failed", exc.message)

    # ---- state ----------------------------------------------------------------------------------
    @staticmethod
    def _group(handle: RunHandle) -> str | None:
        """The handle's resource group; a partial handle's is derived from the run and region."""
        groups = handle.resources.get(RG)
        if groups:
            return groups[0]
        return None if handle.complete else resource_group_name(handle.run_id, handle.region, handle.attempt)

    def console_hint(self, handle: RunHandle, rank: int) -> str:
        """Where to look when a node stopped without a final status (lifecycle adds it to the message)."""
        rg = self._group(handle) or resource_group_name(handle.run_id, handle.region, handle.attempt)
        return f"its boot log: az vm boot-diagnostics get-boot-log -g {rg} -n node-{rank} (until the run is torn down)"

    def node_states(self, handle: RunHandle) -> list[str]:
        """Per node of the handle, from the VM's instance view; "gone" once the VM or its group no
        longer exists. A partial handle without VM names lists the group's VMs."""
        from azure.core.exceptions import ResourceNotFoundError

        rg = self._group(handle)
        if rg is None:
            return []
        names = handle.resources.get(VM)
        if not names:
            try:
                names = sorted(
                    (vm.name for vm in self.compute.virtual_machines.list(rg)),
                    key=lambda n: int(n.rsplit("-", 1)[-1]) if n.rsplit("-", 1)[-1].isdigit() else 0,
                )
            except ResourceNotFoundError:
                return ["gone"] * max(1, len(handle.nodes))
        states = []
        for name in names:
            try:
                vm = self.compute.virtual_machines.get(rg, name, expand="instanceView")
            except ResourceNotFoundError:
                states.append("gone")
                continue
            states.append(vm_state(vm))
        return states

    # ---- teardown / gc --------------------------------------------------------------------------
    def teardown(self, handle: RunHandle, journal: Journal, *, wait: bool = True) -> None:
        """Delete the handle's resource group, and any other group of the run in this region the
        journal still holds (a failed attempt's, whose deletion was only begun). 404 means already
        done. `wait`: until the groups are gone, then the journal rows are marked deleted; without
        it the deletions are begun and the rows stay until a later teardown (the run's own, `down`,
        `gc`) sees them gone."""
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        self._revoke_channel_access(handle, journal)
        pending: list[Any] = []
        for rg in self._groups(handle, journal):
            try:
                pending.append(
                    self.resource.resource_groups.begin_delete(
                        rg, force_deletion_types="Microsoft.Compute/virtualMachines"
                    )
                )
            except ResourceNotFoundError:
                continue
            except AzureError as exc:
                raise _teardown_error(exc, f"resource group {rg}", handle.run_id, "it expires") from None
        if wait:
            for poller in pending:
                try:
                    poller.result()
                except ResourceNotFoundError:
                    pass
        elif not all(poller.done() for poller in pending):
            journal.event(
                handle.run_id,
                "teardown",
                f"{self.name}/{handle.region}: deleting "
                f"{len(pending)} resource group(s); the journal keeps them until they are gone",
            )
            return
        forget_keys(handle.run_id, handle.region)
        for rec in journal.resources(handle.run_id, alive_only=True):
            if rec.cloud == self.name and (rec.region or handle.region) == handle.region:
                journal.deleted(rec.id)

    def _revoke_channel_access(self, handle: RunHandle, journal: Journal) -> None:
        """The nodes' access to the run's blobs goes first: it lives on the channel's container,
        outside the run's group, so the group's deletion does not take it."""
        from azure.core.exceptions import AzureError

        from gpucloud.providers.azure.node_access import revoke

        try:
            revoke(self, journal, handle.run_id, handle.region)
        except AzureError as exc:
            raise _teardown_error(exc, "the run's channel role assignment", handle.run_id, "the run ended") from None

    def session_path(self, handle: RunHandle, rank: int, ask: SessionAsk) -> SessionPlan:
        """ssh to the node's public address with the run's key, through its NSG rule for the caller's /32."""
        return azure_session(self.network, self._group(handle) or "", handle, rank, ask, self.capabilities.vm_dir)

    def _groups(self, handle: RunHandle, journal: Journal) -> list[str]:
        """The handle's group, then the run's other groups in the handle's region that the journal
        still holds."""
        groups = [g for g in [self._group(handle)] if g]
        for rec in journal.resources(handle.run_id, alive_only=True):
            if (
                rec.cloud == self.name
                and rec.kind == "resource_group"
                and rec.region == handle.region
                and rec.name
                and rec.name not in groups
            ):
                groups.append(rec.name)
        return groups

    def gc(self, now: datetime, *, dry_run: bool) -> list[str]:
        """Every resource group (any region: groups are subscription-wide) whose expiry passed,
        reported per call (gc.py)."""
        from gpucloud.providers.azure.gc import sweep

        return sweep(self, now, dry_run=dry_run)
