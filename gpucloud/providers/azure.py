"""Azure: one resource group per run and attempt, holding everything the run's VMs need.

Why one resource group: it is Azure's unit of deletion. Tearing a run down is one long-running
DELETE, a crash leaves one tagged group for `gc` to find, and the VM itself can delete it through
its managed identity when the job ends or the deadline passes (a shutdown inside the guest leaves
the VM "Stopped (allocated)" and billed: FACTS.md section 6).

Per run and region the group holds a VNet with one subnet, an NSG that denies all inbound traffic
(SSH from the caller's address only when the job asks for it; for a multi-node job, everything
from the run's own subnet, i.e. its own nodes), and per node a Standard static public IP (outbound
access: new VNets have no default outbound since Sep 2025), a NIC and the VM. A multi-node job's
VMs share a proximity placement group (one datacenter, low latency between nodes) in the same
group, so it goes when the group goes. ARM has no call that creates N VMs at once (short of a
scale set), so each node's public IP, NIC, VM and role assignment are created by a thread of its
own, in parallel; the shared resources (group, NSG, VNet, placement group) are created once.
Each VM gets a system-assigned identity with the built-in Contributor role on its own group only:
enough to delete the group, nothing outside it, and Contributor cannot grant roles. (A custom role
with just the delete actions would be narrower, but creating role definitions needs rights at the
subscription scope on every user's account; the blast radius here is already the run's own group.)

Endpoints: `GPUCLOUD_AZURE_ARM_ENDPOINT` (ARM base URL; default the public cloud) and
`GPUCLOUD_AZURE_BLOB_ENDPOINT` (see channel_blob.py). Credentials: `DefaultAzureCredential` and
`AZURE_SUBSCRIPTION_ID`, or `credential=` / `subscription_id=` when embedding. The azure SDKs are
imported inside methods so that `gpucloud --help` stays fast.
"""

from __future__ import annotations

import base64
import os
import re
import threading
import time
import uuid
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpucloud.errors import GpucloudError, UserError
from gpucloud.providers.base import (
    TAG_EXPIRES,
    TAG_RUN,
    CapacityError,
    FatalProvisionError,
    LaunchRequest,
    PriceError,
    ProvisionError,
    QuotaError,
    ThrottledError,
    ssh_source_cidr,
)

if TYPE_CHECKING:
    from gpucloud.channel_blob import BlobChannel
    from gpucloud.state import Journal

ARM_ENDPOINT_ENV = "GPUCLOUD_AZURE_ARM_ENDPOINT"
BLOB_ENDPOINT_ENV = "GPUCLOUD_AZURE_BLOB_ENDPOINT"
DEFAULT_ARM_ENDPOINT = "https://management.azure.com"
# Built-in "Contributor" (the same id in every tenant and cloud).
CONTRIBUTOR_ROLE_ID = "b24988ac-6180-42a0-ab88-20f7382dd24c"
ROLE_ASSIGNMENTS_API = "2022-04-01"
CUSTOM_DATA_LIMIT = 64 * 1024          # bytes of base64 (FACTS.md section 6)
ADMIN_USER = "gpucloud"
# When the server gives no Retry-After, poll long-running operations this often (SDK default: 30 s).
DEFAULT_POLL_SECONDS = 5.0
# The run's network: one VNet and one subnet per run; the subnet holds exactly the run's nodes.
VNET_PREFIX = "10.0.0.0/16"
SUBNET_PREFIX = "10.0.0.0/24"
PLACEMENT_GROUP = "ppg"
# Nodes whose resources are created at the same time (ARM's write limits are per subscription).
MAX_PARALLEL_NODES = 16
# How often a node's thread looks up from a long-running operation to see whether to give up.
ABORT_CHECK_S = 0.25
# A new identity takes a while to replicate before a role can be assigned to it.
PRINCIPAL_RETRY_DELAYS = (0.5, 1, 2, 4, 8, 15, 30)

CAPACITY_CODES = frozenset({"AllocationFailed", "ZonalAllocationFailed", "OverconstrainedAllocationRequest",
                            "OverconstrainedZonalAllocationRequest", "SkuNotAvailable"})
QUOTA_CODES = frozenset({"QuotaExceeded", "OperationNotAllowed"})  # OperationNotAllowed only when about quota
THROTTLE_CODES = frozenset({"TooManyRequests", "SubscriptionRequestsThrottled", "ResourceCollectionRequestsThrottled"})
AUTH_CODES = frozenset({"AuthorizationFailed", "AuthenticationFailed", "InvalidAuthenticationToken",
                        "InvalidAuthenticationTokenTenant", "SubscriptionNotFound", "LinkedAuthorizationFailed"})

# Ubuntu images on Azure (FACTS.md section 3): version -> (publisher, offer, Gen2 sku, Gen1 sku).
UBUNTU_IMAGES: dict[str, tuple[str, str, str, str]] = {
    "20.04": ("Canonical", "0001-com-ubuntu-server-focal", "20_04-lts-gen2", "20_04-lts"),
    "22.04": ("Canonical", "0001-com-ubuntu-server-jammy", "22_04-lts-gen2", "22_04-lts"),
    "24.04": ("Canonical", "ubuntu-24_04-lts", "server", "server-gen1"),
}
# Sizes that boot only Generation 1 images: NC v1 (K80), NC_Promo, NV v1 (M60).
GEN1_ONLY_SIZE = re.compile(r"^Standard_N[CV]\d+r?(_Promo)?$", re.IGNORECASE)


def resource_group_name(run_id: str, region: str) -> str:
    """One group per run and region: a failover to another region never collides with a group of
    the same run that is still being deleted (a group's location is fixed)."""
    return f"gpucloud-{run_id}-{region}"[:90]


def expires_tag(when: datetime) -> str:
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_expires(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def needs_gen1(instance_type: str, gpu: str) -> bool:
    return gpu.upper() == "K80" or bool(GEN1_ONLY_SIZE.match(instance_type))


def image_reference(image: str, ubuntu_version: str, instance_type: str, gpu: str) -> dict[str, str]:
    """The VM's imageReference: the job's `image:` wins (a URN `publisher:offer:sku:version` or an
    image resource id); otherwise Ubuntu of the stack, Gen1 where the size requires it."""
    if image and image != "auto":
        if image.startswith("/"):
            return {"id": image}
        parts = image.split(":")
        if len(parts) != 4 or not all(parts):
            raise UserError(f"image {image!r} is not an Azure image URN.",
                            hint="Use publisher:offer:sku:version (e.g. Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest) or an image resource id.")
        return dict(zip(("publisher", "offer", "sku", "version"), parts))
    version = ubuntu_version if ubuntu_version in UBUNTU_IMAGES else "22.04"
    publisher, offer, gen2, gen1 = UBUNTU_IMAGES[version]
    return {"publisher": publisher, "offer": offer, "sku": gen1 if needs_gen1(instance_type, gpu) else gen2,
            "version": "latest"}


def _error_code_and_message(exc: Exception) -> tuple[str, str, int | None]:
    status = getattr(exc, "status_code", None)
    error = getattr(exc, "error", None)
    code = getattr(error, "code", None) or ""
    message = getattr(error, "message", None) or ""
    if not code:
        # Older/odd bodies: the message still reads "(Code) text".
        m = re.match(r"\(([A-Za-z.]+)\)\s*(.*)", str(getattr(exc, "message", "") or exc), re.S)
        if m:
            code, message = m[1], m[2]
    if not message:
        message = str(getattr(exc, "message", "") or exc)
    message = message.strip().splitlines()[0] if message.strip() else ""
    return code, message, status


def quota_family(message: str, instance_type: str) -> str:
    """The quota Azure says is exhausted, named as the portal names it where the message allows."""
    m = re.search(r"(Standard [\w ]+? Family vCPUs|Total Regional (?:Low-priority |Spot )?vCPUs)", message, re.I)
    if m:
        return m[1]
    m = re.search(r"approved (?:(\w+?) ?)?Cores quota", message)
    if m:
        name = m[1] or "Cores"
        if name.lower() == "lowpriority":
            return "Total Regional Spot vCPUs (LowPriorityCores)"
        if name.lower() == "cores":
            return "Total Regional vCPUs"
        fam = re.fullmatch(r"standard(\w+?)Family", name, re.I)
        if fam:
            return f"Standard {fam[1]} Family vCPUs"
        return f"{name} vCPUs"
    if "lowpriority" in message.lower() or "spot" in message.lower():
        return "Total Regional Spot vCPUs"
    return f"the vCPU quota of {instance_type}'s family"


def classify_error(exc: Exception, *, where: str, instance_type: str = "", region: str = "") -> ProvisionError:
    """Turn an Azure SDK error into the ProvisionError kind that drives failover (FACTS.md s4)."""
    from gpucloud.providers.azure_access import classify_access

    if isinstance(exc, ProvisionError):
        return exc
    access = classify_access(exc, what=where)  # no credentials / dead endpoint: skip Azure, not a quota
    if access is not None:
        return access  # type: ignore[return-value]
    code, message, status = _error_code_and_message(exc)
    text = f"{code}: {message}" if code else message
    if code in CAPACITY_CODES:
        return CapacityError(f"no capacity for {instance_type} in {region} ({text})", code=code)
    if code in QUOTA_CODES and (code == "QuotaExceeded" or "quota" in message.lower()):
        family = quota_family(message, instance_type)
        return QuotaError(f"quota exceeded: {family} in {region} ({code})", code=code, quota_code=family,
                          hint=f"Request more '{family}' quota for {region} in the Azure portal (Quotas > Compute).")
    if "maxprice" in code.lower() or re.search(r"max(imum)? ?price", message, re.I):
        return PriceError(f"spot price above max_price_per_hour for {instance_type} in {region} ({text})", code=code)
    if status == 429 or code in THROTTLE_CODES:
        return ThrottledError(f"Azure kept throttling while {where} ({text or 'HTTP 429'}); backed off and gave up",
                              code=code or "TooManyRequests")
    if code in AUTH_CODES or status in (401, 403):
        return FatalProvisionError(f"Azure refused {where}: {text}", code=code,
                                   hint="The signed-in identity needs Contributor and User Access Administrator "
                                        "(or Owner) on the subscription: gpucloud assigns each VM a role on its own resource group.")
    if status is not None and status >= 500:
        return ThrottledError(f"Azure failed while {where} (HTTP {status} {text}); retried and gave up", code=code or str(status))
    return FatalProvisionError(f"Azure rejected {where}: {text or type(exc).__name__}", code=code)


def _allow_http_policy() -> Any:
    """A per-call policy that lets the bearer-token policy send tokens to an http:// endpoint
    (an emulator or a local proxy named by GPUCLOUD_AZURE_ARM_ENDPOINT)."""
    from azure.core.pipeline.policies import SansIOHTTPPolicy

    class AllowHttp(SansIOHTTPPolicy):  # type: ignore[type-arg]
        def on_request(self, request: Any) -> None:
            request.context.options["enforce_https"] = False

    return AllowHttp()


def _ssh_public_key() -> str:
    """The caller's key when SSH is asked for; else a throwaway key nobody holds (Azure requires a
    key when password login is disabled, and password login is never enabled)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def _user_ssh_key() -> str:
    home = os.path.expanduser("~/.ssh")
    for name in ("id_ed25519.pub", "id_rsa.pub", "id_ecdsa.pub"):
        path = os.path.join(home, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                return fh.read().strip()
    raise UserError("resources.ssh is true but no public key was found in ~/.ssh (id_ed25519.pub, id_rsa.pub).",
                    hint="Create one with `ssh-keygen -t ed25519`.")


class AzureProvider:
    """The Azure implementation of the Provider protocol (providers/base.py)."""

    name = "azure"
    # Seconds between the lifecycle's reads of status.json and log parts: Blob GETs are cheap, and
    # a short interval keeps the streamed log responsive (the VM ships parts every 5 s).
    poll_interval = 2.0

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
        self.arm_endpoint = (arm_endpoint or os.environ.get(ARM_ENDPOINT_ENV) or DEFAULT_ARM_ENDPOINT).rstrip("/")
        self.blob_endpoint = blob_endpoint or os.environ.get(BLOB_ENDPOINT_ENV) or None
        self._clients: dict[str, Any] = {}
        self._channels: dict[str, BlobChannel] = {}
        self._node_counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    # ---- clients ----------------------------------------------------------------------------
    @property
    def subscription_id(self) -> str:
        sub = self._subscription_id or os.environ.get("AZURE_SUBSCRIPTION_ID")
        if not sub:
            from gpucloud.providers.azure_access import no_subscription

            raise no_subscription()
        return sub

    def credential(self) -> Any:
        if self._credential is None:
            from gpucloud.providers.azure_access import default_credential

            self._credential = default_credential()
        return self._credential

    def _client_kwargs(self) -> dict[str, Any]:
        from gpucloud.providers.azure_access import pipeline_kwargs

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

        from gpucloud.channel_blob import BlobChannel

        if region not in self._channels:
            try:
                self._channels[region] = BlobChannel.for_region(
                    self.resource, subscription_id=self.subscription_id, region=region,
                    blob_endpoint=self.blob_endpoint, credential=self.credential())
            except AzureError as exc:
                raise classify_error(exc, where=f"preparing the storage account in {region}", region=region) from None
        return self._channels[region]

    # ---- provision ----------------------------------------------------------------------------
    def provision(self, req: LaunchRequest, journal: Journal) -> list[str]:
        """Create the run's group, network, placement group (multi-node) and VMs (in parallel);
        on any failure, of any node, delete the group, then raise."""
        from azure.core.exceptions import AzureError

        cand = req.candidate
        region = cand.region
        rg = resource_group_name(req.run_id, region)
        self._node_counts[(req.run_id, region)] = len(req.user_data)
        tags = {**req.tags, TAG_RUN: req.run_id, TAG_EXPIRES: expires_tag(req.expires_at)}
        tags.setdefault("Name", f"gpucloud-{req.spec.name}")
        for rank, script in enumerate(req.user_data):
            size = len(base64.b64encode(script.encode()))
            if size > CUSTOM_DATA_LIMIT:
                raise FatalProvisionError(
                    f"the bootstrap of node {rank} is {size // 1024} KB in base64; Azure custom data is limited to 64 KB.",
                    code="CustomDataTooLarge")
        # Everything that can fail without touching the cloud comes first.
        ssh_key = _user_ssh_key() if req.spec.resources.ssh else _ssh_public_key()
        nsg_body = self._nsg_body(req, region, tags)
        step = "creating the resource group"
        try:
            self._tracked(journal, req.run_id, region, "resource_group", rg,
                          lambda: self.resource.resource_groups.create_or_update(
                              rg, {"location": region, "tags": tags}).id)
            step = "creating the network security group"
            nsg_id = self._tracked(journal, req.run_id, region, "nsg", "nsg",
                                   lambda: self.network.network_security_groups.begin_create_or_update(
                                       rg, "nsg", nsg_body).result().id)
            step = "creating the virtual network"
            vnet = self._tracked(journal, req.run_id, region, "vnet", "vnet",
                                 lambda: self.network.virtual_networks.begin_create_or_update(rg, "vnet", {
                                     "location": region, "tags": tags,
                                     "properties": {"addressSpace": {"addressPrefixes": [VNET_PREFIX]},
                                                    "subnets": [{"name": "default", "properties": {
                                                        "addressPrefix": SUBNET_PREFIX,
                                                        "networkSecurityGroup": {"id": nsg_id}}}]},
                                 }).result().id)
            ppg_id = None
            if len(req.user_data) > 1:
                step = "creating the proximity placement group"
                ppg_id = self._tracked(journal, req.run_id, region, "placement_group", PLACEMENT_GROUP,
                                       lambda: self.compute.proximity_placement_groups.create_or_update(
                                           rg, PLACEMENT_GROUP, {
                                               "location": region, "tags": tags,
                                               "properties": {"proximityPlacementGroupType": "Standard",
                                                              "intent": {"vmSizes": [cand.instance_type]}}}).id)
            return self._create_nodes(req, journal, rg, tags, f"{vnet}/subnets/default", nsg_id, ppg_id, ssh_key)
        except (AzureError, ProvisionError, _NodeFailed) as exc:
            cause: Exception = exc
            if isinstance(exc, _NodeFailed):  # any node's failure fails the whole attempt
                step, cause = exc.step, exc.cause
            error = classify_error(cause, where=step, instance_type=cand.instance_type, region=region)
            self._cleanup_after_failure(req.run_id, region, journal)
            raise error from None

    def _create_nodes(self, req: LaunchRequest, journal: Journal, rg: str, tags: dict[str, str], subnet_id: str,
                      nsg_id: str, ppg_id: str | None, ssh_key: str) -> list[str]:
        """Every node's public IP, NIC, VM and role assignment, one thread per node. The first
        failure stops the other threads at their next step (a VM still being created is left to
        the group's deletion) and is raised as `_NodeFailed` once every thread has stopped, so no
        creation lands after the cleanup. Returns the VM ids in rank order."""
        from azure.core.exceptions import AzureError

        n = len(req.user_data)
        abort = threading.Event()
        failures: list[_NodeFailed] = []
        lock = threading.Lock()

        def node(rank: int) -> str:
            step = f"creating the public IP of node {rank}"
            try:
                pip_id = self._tracked(journal, req.run_id, req.candidate.region, "public_ip", f"pip-{rank}",
                                       lambda: _await(self.network.public_ip_addresses.begin_create_or_update(
                                           rg, f"pip-{rank}", self._pip_body(req, tags)), abort).id)
                step = f"creating the network interface of node {rank}"
                nic_id = self._tracked(journal, req.run_id, req.candidate.region, "nic", f"nic-{rank}",
                                       lambda: _await(self.network.network_interfaces.begin_create_or_update(
                                           rg, f"nic-{rank}", self._nic_body(req, tags, nsg_id, subnet_id, pip_id)),
                                           abort).id)
                step = f"creating VM {rank} ({req.candidate.instance_type})"
                _check(abort)
                body = self._vm_body(req, rank, req.user_data[rank], nic_id, req.candidate.region, tags, ssh_key, ppg_id)
                res_id = journal.intent(req.run_id, "vm", f"node-{rank}", req.candidate.region, self.name)
                vm = _await(self.compute.virtual_machines.begin_create_or_update(rg, f"node-{rank}", body), abort)
                journal.created(res_id, vm.id)
                step = f"granting VM {rank} the right to delete its resource group"
                self._grant_self_delete(journal, req.run_id, req.candidate.region, rg, vm, abort=abort)
                return str(vm.id)
            except _Aborted:
                raise
            except (AzureError, ProvisionError) as exc:
                with lock:
                    failures.append(_NodeFailed(rank, step, exc))
                abort.set()
                raise
            except BaseException:
                abort.set()
                raise

        pool = ThreadPoolExecutor(max_workers=min(n, MAX_PARALLEL_NODES), thread_name_prefix=f"azure-{req.run_id}")
        futures = [pool.submit(node, rank) for rank in range(n)]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
            if any(f.done() and f.exception() is not None for f in futures):
                abort.set()
            wait(futures)
        except BaseException:  # Ctrl-C in this thread: stop the nodes' threads before the lifecycle tears down
            abort.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        if failures:
            raise failures[0]
        for f in futures:
            exc = f.exception()
            if exc is not None and not isinstance(exc, _Aborted):
                raise exc
        return [f.result() for f in futures]

    def _pip_body(self, req: LaunchRequest, tags: dict[str, str]) -> dict[str, Any]:
        return {"location": req.candidate.region, "tags": tags, "sku": {"name": "Standard", "tier": "Regional"},
                "properties": {"publicIPAllocationMethod": "Static", "publicIPAddressVersion": "IPv4"}}

    def _nic_body(self, req: LaunchRequest, tags: dict[str, str], nsg_id: str, subnet_id: str,
                  pip_id: str) -> dict[str, Any]:
        return {"location": req.candidate.region, "tags": tags,
                "properties": {"networkSecurityGroup": {"id": nsg_id}, "ipConfigurations": [{
                    "name": "ipconfig", "properties": {
                        "subnet": {"id": subnet_id},
                        "privateIPAllocationMethod": "Dynamic",
                        "publicIPAddress": {"id": pip_id}}}]}}

    def _tracked(self, journal: Journal, run_id: str, region: str, kind: str, name: str, create: Any,
                 cloud_id: Any = None) -> Any:
        """Journal the intent, make the call, journal the result (INTERNALS: Providers)."""
        res_id = journal.intent(run_id, kind, name, region, self.name)
        result = create()
        journal.created(res_id, cloud_id(result) if cloud_id else str(result))
        return result

    def _nsg_body(self, req: LaunchRequest, region: str, tags: dict[str, str]) -> dict[str, Any]:
        """Inbound: nothing from anywhere, except node-to-node within the run's subnet for
        multi-node jobs and SSH from the caller's address when the job asks for it."""
        rules: list[dict[str, Any]] = [{
            "name": "deny-all-inbound", "properties": {
                "priority": 4096, "direction": "Inbound", "access": "Deny", "protocol": "*",
                "sourceAddressPrefix": "*", "sourcePortRange": "*",
                "destinationAddressPrefix": "*", "destinationPortRange": "*"}}]
        if len(req.user_data) > 1:
            # The run's own nodes, and only them: the subnet is the run's (not the VirtualNetwork
            # tag, which also covers peered networks, gateways and the host's 168.63.129.16).
            rules.append({"name": "allow-run-nodes-inbound", "properties": {
                "priority": 4000, "direction": "Inbound", "access": "Allow", "protocol": "*",
                "sourceAddressPrefix": SUBNET_PREFIX, "sourcePortRange": "*",
                "destinationAddressPrefix": SUBNET_PREFIX, "destinationPortRange": "*"}})
        if req.spec.resources.ssh:
            rules.append({"name": "allow-ssh-from-caller", "properties": {
                "priority": 1000, "direction": "Inbound", "access": "Allow", "protocol": "Tcp",
                "sourceAddressPrefix": ssh_source_cidr(), "sourcePortRange": "*",
                "destinationAddressPrefix": "*", "destinationPortRange": "22"}})
        return {"location": region, "tags": tags, "properties": {"securityRules": rules}}

    def _vm_body(self, req: LaunchRequest, rank: int, script: str, nic_id: str, region: str,
                 tags: dict[str, str], ssh_key: str, ppg_id: str | None = None) -> dict[str, Any]:
        cand = req.candidate
        props: dict[str, Any] = {
            "hardwareProfile": {"vmSize": cand.instance_type},
            "storageProfile": {
                "imageReference": image_reference(req.spec.image, req.stack.ubuntu_version, cand.instance_type, cand.gpu),
                "osDisk": {"name": f"osdisk-{rank}", "createOption": "FromImage", "deleteOption": "Delete",
                           "diskSizeGB": req.spec.resources.disk_gb,
                           "managedDisk": {"storageAccountType": "StandardSSD_LRS"}},
            },
            "osProfile": {
                "computerName": f"{req.spec.name}-{rank}"[:63],
                "adminUsername": ADMIN_USER,
                "customData": base64.b64encode(script.encode()).decode(),
                "linuxConfiguration": {
                    "disablePasswordAuthentication": True,
                    "ssh": {"publicKeys": [{"path": f"/home/{ADMIN_USER}/.ssh/authorized_keys", "keyData": ssh_key}]},
                },
            },
            "networkProfile": {"networkInterfaces": [{"id": nic_id, "properties": {"primary": True, "deleteOption": "Delete"}}]},
            # Serial console log in managed storage (no account needed): what `console_hint` points to.
            "diagnosticsProfile": {"bootDiagnostics": {"enabled": True}},
        }
        if ppg_id:
            props["proximityPlacementGroup"] = {"id": ppg_id}
        if cand.spot:
            max_price = req.spec.resources.max_price_per_hour
            props.update({"priority": "Spot", "evictionPolicy": "Delete",
                          "billingProfile": {"maxPrice": float(max_price) if max_price else -1}})
        return {"location": region, "tags": tags, "identity": {"type": "SystemAssigned"}, "properties": props}

    def _grant_self_delete(self, journal: Journal, run_id: str, region: str, rg: str, vm: Any, *,
                           abort: threading.Event | None = None) -> None:
        """Contributor on the VM's own resource group for its system-assigned identity."""
        from azure.core.exceptions import HttpResponseError
        from azure.core.rest import HttpRequest

        principal = vm.identity.principal_id
        scope = f"/subscriptions/{self.subscription_id}/resourceGroups/{rg}"
        name = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{vm.id}/self-delete"))  # idempotent on retry
        url = f"{scope}/providers/Microsoft.Authorization/roleAssignments/{name}?api-version={ROLE_ASSIGNMENTS_API}"
        body = {"properties": {
            "roleDefinitionId": f"/subscriptions/{self.subscription_id}/providers/Microsoft.Authorization/roleDefinitions/{CONTRIBUTOR_ROLE_ID}",
            "principalId": principal, "principalType": "ServicePrincipal",
            "description": f"gpucloud run {run_id}: lets the VM delete its own resource group"}}
        res_id = journal.intent(run_id, "role_assignment", name, region, self.name)
        delays = list(PRINCIPAL_RETRY_DELAYS)
        while True:
            response = self.resource.send_request(HttpRequest("PUT", url, json=body))
            if response.status_code in (200, 201):
                break
            try:
                response.raise_for_status()
            except HttpResponseError as exc:
                code, _, _ = _error_code_and_message(_with_arm_error(exc, response))
                if code == "RoleAssignmentExists":
                    break
                if code == "PrincipalNotFound" and delays:
                    journal.event(run_id, "retry", f"identity of {vm.name} not replicated yet; retrying the role assignment")
                    delay = delays.pop(0)
                    if abort is None:
                        time.sleep(delay)
                    elif abort.wait(delay):
                        raise _Aborted()
                    continue
                raise _with_arm_error(exc, response) from None
        journal.created(res_id, f"{scope}/providers/Microsoft.Authorization/roleAssignments/{name}")

    def _cleanup_after_failure(self, run_id: str, region: str, journal: Journal) -> None:
        """Delete what the failed attempt made; if even that fails, teardown/gc will find the tags."""
        try:
            self.teardown(run_id, region, journal, wait=True)
        except GpucloudError as exc:
            journal.event(run_id, "cleanup-failed", exc.message)

    # ---- state ----------------------------------------------------------------------------------
    def console_hint(self, run_id: str, rank: int) -> str:
        """Where to look when a node stopped without a final status (lifecycle adds it to the message)."""
        region = next((r for (rid, r) in self._node_counts if rid == run_id), "<region>")
        return (f"its boot log: az vm boot-diagnostics get-boot-log -g {resource_group_name(run_id, region)} "
                f"-n node-{rank} (until the run is torn down)")

    def node_states(self, run_id: str, region: str) -> list[str]:
        """Per node from the VM's instance view; "gone" once the VM or its group no longer exists."""
        from azure.core.exceptions import ResourceNotFoundError

        rg = resource_group_name(run_id, region)
        count = self._node_counts.get((run_id, region))
        if count is None:
            try:
                names = [vm.name for vm in self.compute.virtual_machines.list(rg)]
            except ResourceNotFoundError:
                return ["gone"]
            count = max((int(n.split("-")[-1]) + 1 for n in names if re.fullmatch(r"node-\d+", n)), default=1)
        states = []
        for rank in range(count):
            try:
                vm = self.compute.virtual_machines.get(rg, f"node-{rank}", expand="instanceView")
            except ResourceNotFoundError:
                states.append("gone")
                continue
            states.append(_vm_state(vm))
        return states

    # ---- teardown / gc --------------------------------------------------------------------------
    def teardown(self, run_id: str, region: str, journal: Journal, *, wait: bool = True) -> None:
        """Delete the run's resource group (with everything in it). 404 means already done."""
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        rg = resource_group_name(run_id, region)
        try:
            poller = self.resource.resource_groups.begin_delete(rg, force_deletion_types="Microsoft.Compute/virtualMachines")
            if wait:
                poller.result()
        except ResourceNotFoundError:
            pass
        except AzureError as exc:
            code, message, status = _error_code_and_message(exc)
            raise GpucloudError(f"could not delete resource group {rg}: {code or status} {message}".strip(),
                                hint=f"Retry with `gpucloud down {run_id}`; `gpucloud gc` also deletes it once it expires.") from None
        for rec in journal.resources(run_id, alive_only=True):
            if rec.cloud == self.name and (rec.region or region) == region:
                journal.deleted(rec.id)

    def gc(self, now: datetime, *, dry_run: bool) -> list[str]:
        """Every resource group (any region: groups are subscription-wide) whose expiry passed."""
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        if now.tzinfo is None:
            now = now.replace(tzinfo=UTC)
        lines: list[str] = []
        pollers = []
        try:
            groups = list(self.resource.resource_groups.list(filter=f"tagName eq '{TAG_EXPIRES}'"))
        except AzureError as exc:
            raise classify_error(exc, where="listing resource groups") from None
        for group in groups:
            tags = group.tags or {}
            expires = parse_expires(tags.get(TAG_EXPIRES, ""))
            if expires is None or expires > now:
                continue
            state = getattr(group.properties, "provisioning_state", None) if group.properties else None
            line = f"azure/{group.location}/resource-group/{group.name} (run {tags.get(TAG_RUN, '?')}, expired {expires_tag(expires)})"
            if dry_run:
                lines.append(f"would delete {line}")
                continue
            try:
                pollers.append((line, self.resource.resource_groups.begin_delete(
                    group.name, force_deletion_types="Microsoft.Compute/virtualMachines")))
            except ResourceNotFoundError:
                continue
            except AzureError as exc:
                code, message, _ = _error_code_and_message(exc)
                lines.append(f"failed to delete {line}: {code} {message}")
                continue
            if state == "Deleting":
                line += " (was already being deleted)"
        for line, poller in pollers:
            try:
                poller.result()
                lines.append(f"deleted {line}")
            except ResourceNotFoundError:
                lines.append(f"deleted {line}")
            except AzureError as exc:
                code, message, _ = _error_code_and_message(exc)
                lines.append(f"failed to delete {line}: {code} {message}")
        return lines


class _Aborted(Exception):
    """A node's thread stopped because another node of the attempt failed (or Ctrl-C)."""


class _NodeFailed(Exception):
    """The first failure among a multi-node attempt's node threads: which step, and the cause."""

    def __init__(self, rank: int, step: str, cause: Exception) -> None:
        super().__init__(f"node {rank}: {step}: {cause}")
        self.rank, self.step, self.cause = rank, step, cause


def _check(abort: threading.Event) -> None:
    if abort.is_set():
        raise _Aborted()


def _await(poller: Any, abort: threading.Event) -> Any:
    """A long-running operation's result, unless `abort` is set first (then `_Aborted`; the
    operation goes on in Azure and ends with the resource group)."""
    while not poller.done():
        _check(abort)
        poller.wait(ABORT_CHECK_S)
    return poller.result()


def _with_arm_error(exc: Any, response: Any) -> Any:
    """send_request errors carry the raw body; parse ARM's `{"error": {code, message}}` into them."""
    if getattr(exc, "error", None) is None:
        try:
            doc = response.json()
        except ValueError:
            doc = None
        err = (doc or {}).get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict):
            from azure.core.exceptions import ODataV4Format

            exc.error = ODataV4Format(err)
    return exc


def _vm_state(vm: Any) -> str:
    props = vm.properties
    view = getattr(props, "instance_view", None) if props is not None else None
    statuses = [s.code or "" for s in (getattr(view, "statuses", None) or [])]
    power = next((c.split("/", 1)[1] for c in statuses if c.startswith("PowerState/")), None)
    provisioning = (getattr(props, "provisioning_state", None) or "").lower()
    if provisioning == "deleting":
        return "stopping"
    if power is None:
        return "gone" if provisioning == "failed" else "pending"
    if power in ("running",):
        return "running"
    if power in ("starting",):
        return "pending"
    return "stopping"  # stopping, stopped (still billed), deallocating, deallocated
