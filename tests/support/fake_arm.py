"""A fake Azure Resource Manager: the REST calls gpucloud makes, spoken as ARM speaks them.

What it covers (exactly what gpucloud/providers/azure/ (provider.py, channel.py) and the VM-side
self-delete use): resource groups (PUT/GET/HEAD/DELETE, list with a tag filter, deletion as a
long-running operation answered with `Location` polling), every resource under a group (VNets with
inline subnets, NSGs, public IPs, NICs, VMs, storage accounts) created through `Azure-AsyncOperation`
polling, VM instance views, proximity placement groups (created synchronously, as ARM does; a VM
joins one through `properties.proximityPlacementGroup.id`, which must exist in the VM's location,
and a GET of the group lists its `virtualMachines`), role assignments (an extension resource at a
group's scope or below it on a resource that exists, e.g. the channel's container; a condition only
with conditionVersion 2.0 and a syntax tests/support/abac.py reads; listed at or below a scope;
a role that does not exist is 400 `RoleDefinitionDoesNotExist`; a VM's ARM calls are authorised by
its assignments' roles: Contributor anything below its scope, any other role only its `Actions`,
as built-in Storage Blob Data Contributor's container read/write/delete, Blob Containers - Get and
Delete through ARM), storage account `listKeys`, the
subscription and its locations (GET, as `gpucloud check` and
the credentials check before `run`'s launch prompt read them: Azure's full Subscriptions - Get body,
404 `SubscriptionNotFound` for another id, `subscription_state` for a disabled one; a bearer token
it did not issue, or any token after `revoked = True`, is 401 `InvalidAuthenticationToken`, as ARM
answers a revoked secret), Compute usages per location with vCPU quotas that a VM create cannot
go past (409 QuotaExceeded; azure_quota.py), marketplace image versions with their OS disk size,
which a VM's OS disk may not be below (azure_images.py), and two token endpoints:

- `/_identity` — an App Service managed-identity endpoint. With `IDENTITY_ENDPOINT` and
  `IDENTITY_HEADER` pointing here, azure-identity's `DefaultAzureCredential` in a CLI subprocess
  gets a token for the all-powerful "operator" principal, with no test code in the product.
- `/_imds/<principalId>/metadata/identity/oauth2/token` and `.../metadata/instance` — the IMDS of
  one simulated VM (its base URL is what the simulator puts into GPUCLOUD_IMDS_ENDPOINT). Tokens
  for a VM's managed identity are authorised by the role assignments that exist, so a VM deletes
  its resource group only if the provider really granted it that right. A token for the storage
  audience is a JWT naming the VM's principal (`oid`), as Azurite's OAuth mode reads one; the blob
  front (tests/support/blob_front.py) authorises it by the principal's channel assignments.

Failure injection: `inject(method, path_regex, code=...)` answers the next `times` matching calls
with an ARM error body `{"error": {"code", "message"}}` (status from the code, or given), either at
once or as a failed long-running operation (`async_=True`), or only stalls them (`delay=`: the
request; `op_seconds=`: the long-running operation it starts, e.g. a VM that takes a while).
Everything lives in memory; `snapshot()` lists what exists (leak checks); deleting a resource group
deletes everything in it. `calls` records every ARM call but the polls; `requests` counts every
HTTP request, polls and token requests included (the provisioning benchmark reads both). Runs
standalone: `python -m tests.support.fake_arm --port N`, with `/_fake/snapshot`, `/_fake/inject`,
`/_fake/reset` for out-of-process control.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from tests.support.azure_images import VERSIONS_RE, Images
from tests.support.azure_quota import Quotas

DEFAULT_SUBSCRIPTION = "00000000-0000-0000-0000-00000000c10d"
DEFAULT_TENANT = "00000000-0000-0000-0000-0000000a11ce"
OPERATOR_PRINCIPAL = "operator"
IDENTITY_HEADER = "gpucloud-fake-arm-identity-secret"
# Azurite's published development account (https://learn.microsoft.com/azure/storage/common/storage-use-azurite).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CONTRIBUTOR_ROLE = "b24988ac-6180-42a0-ab88-20f7382dd24c"
BLOB_CONTRIBUTOR_ROLE = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
_BLOBS = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs"
# Built-in roles as Azure defines them ("Azure built-in roles for Storage" and "... General",
# https://learn.microsoft.com/azure/role-based-access-control/built-in-roles/storage): Storage Blob
# Data Contributor holds control-plane Actions on containers besides its data actions.
BUILTIN_ROLES: dict[str, dict[str, list[str]]] = {
    CONTRIBUTOR_ROLE: {"actions": ["*"], "notActions": [], "dataActions": [], "notDataActions": []},
    BLOB_CONTRIBUTOR_ROLE: {
        "actions": [
            "Microsoft.Storage/storageAccounts/blobServices/containers/delete",
            "Microsoft.Storage/storageAccounts/blobServices/containers/read",
            "Microsoft.Storage/storageAccounts/blobServices/containers/write",
            "Microsoft.Storage/storageAccounts/blobServices/generateUserDelegationKey/action",
        ],
        "notActions": [],
        "dataActions": [f"{_BLOBS}/{a}" for a in ("delete", "read", "write", "move/action", "add/action")],
        "notDataActions": [],
    },
}
STORAGE_AUDIENCE = "https://storage.azure.com"
CUSTOM_DATA_MAX_B64 = 65536
PPG_TYPE = "microsoft.compute/proximityplacementgroups"
AVSET_TYPE = "microsoft.compute/availabilitysets"
VM_TYPE = "microsoft.compute/virtualmachines"
NIC_TYPE = "microsoft.network/networkinterfaces"
# Resource types whose PUT completes in the call itself (no long-running operation, no provisioningState).
SYNC_TYPES = frozenset({PPG_TYPE, AVSET_TYPE})
# Sizes and Gen1 images ARM refuses Trusted Launch on: "The VM size '...' is not supported for creation of
# VMs and Virtual Machine Scale Sets with 'TrustedLaunch' security type" (trusted-launch.md's size table).
NO_TRUSTED_LAUNCH_SIZES = frozenset(
    {
        "standard_nc6",
        "standard_nc12",
        "standard_nc24",
        "standard_nc24r",
        "standard_nd96asr_v4",
        "standard_nd96amsr_a100_v4",
    }
)
GEN1_SKUS = frozenset({"20_04-lts", "22_04-lts", "server-gen1", "18.04-lts"})
# Sizes whose NIC may not carry accelerated networking (ARM refuses the VM:
# VMSizeIsNotPermittedToEnableAcceleratedNetworking; the series pages' "Feature support").
NO_ACCELERATED_NETWORKING = frozenset(
    {"standard_nc6", "standard_nc12", "standard_nc24", "standard_nc24r", "standard_nc6s_v3", "standard_nc24s_v3"}
)

# Status codes ARM uses for the error codes tests inject (anything else: 400).
_STATUS_BY_CODE = {
    "TooManyRequests": 429,
    "SubscriptionRequestsThrottled": 429,
    "ResourceGroupNotFound": 404,
    "ResourceNotFound": 404,
    "NotFound": 404,
    "OperationNotAllowed": 409,
    "QuotaExceeded": 409,
    "SkuNotAvailable": 409,
    "AllocationFailed": 409,
    "ZonalAllocationFailed": 409,
    "OverconstrainedAllocationRequest": 409,
    "Conflict": 409,
    "InternalServerError": 500,
    "ServiceUnavailable": 503,
    "AuthorizationFailed": 403,
    "AuthenticationFailed": 401,
    "InvalidAuthenticationToken": 401,
    "ExpiredAuthenticationToken": 401,
    "SubscriptionNotFound": 404,
    "PrincipalNotFound": 400,
    "InvalidParameter": 400,
    "GatewayTimeout": 504,
}

_RG_RE = re.compile(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)$", re.I)
_RG_LIST_RE = re.compile(r"^/subscriptions/([^/]+)/resourcegroups$", re.I)
_SUB_RE = re.compile(r"^/subscriptions/([^/]+)(/locations)?$", re.I)
FAKE_LOCATIONS = ("eastus", "westus2", "westeurope", "southcentralus")
_OP_RE = re.compile(
    r"^/subscriptions/[^/]+/providers/[^/]+/locations/[^/]+/(operations|operationresults)/([^/]+)$", re.I
)
_RG_OPRESULT_RE = re.compile(r"^/subscriptions/[^/]+/operationresults/([^/]+)$", re.I)
_ROLE_RE = re.compile(r"^(?P<scope>/.*?)/providers/microsoft\.authorization/roleassignments/(?P<name>[^/]+)$", re.I)
_ROLE_LIST_RE = re.compile(
    r"^(?P<scope>/subscriptions/[^/]+.*?)/providers/microsoft\.authorization/roleassignments$", re.I
)
_STORAGE_SCOPE_RE = re.compile(
    r"^(?P<account>/subscriptions/[^/]+/resourcegroups/[^/]+/providers/microsoft\.storage/storageaccounts/[^/]+)"
    r"(?:/blobservices/default(?:/containers/[a-z0-9-]+)?)?$",
    re.I,
)
_CONTAINER_RE = re.compile(
    r"^(?P<account>/subscriptions/[^/]+/resourcegroups/[^/]+/providers/microsoft\.storage/storageaccounts/[^/]+)"
    r"/blobservices/default/containers/(?P<name>[a-z0-9-]+)$",
    re.I,
)
_ROLEDEF_RE = re.compile(r"^/subscriptions/([^/]+)/providers/microsoft\.authorization/roledefinitions/([^/]+)$", re.I)
_NESTED_RE = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourcegroups/(?P<rg>[^/]+)/providers/(?P<ns>[^/]+)/(?P<rest>.+)$", re.I
)
_USAGES_RE = re.compile(r"^/subscriptions/([^/]+)/providers/microsoft\.compute/locations/([^/]+)/usages$", re.I)
_RG_RESOURCES_RE = re.compile(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)/resources$", re.I)
_IMDS_RE = re.compile(
    r"^/_imds/(?P<principal>[^/]+)/metadata/(?P<what>identity/oauth2/token|instance|instance/compute|scheduledevents)$"
)


@dataclass
class Injection:
    """One armed failure: the next `times` calls matching `method` and `path` (regex, searched in
    the path without query) fail with `code`, or are only delayed when `code` is None."""

    method: str
    path: re.Pattern[str]
    code: str | None
    message: str
    status: int
    times: int
    async_: bool = False
    delay: float = 0.0
    principal: str | None = None  # only calls made with this identity's token
    op_seconds: float | None = None  # the long-running operation this call starts takes this long
    query: re.Pattern[str] | None = None  # only calls whose query ("k=v&...") this regex finds
    hits: int = 0
    gather: int = 0  # hold each matching call until this many are in flight at once (at most `delay` s)
    most_at_once: int = 0  # the most matching calls held at the same moment (with `gather`)
    _held: int = 0
    _released: bool = False
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)

    def stall(self) -> None:
        """The call's stall: `delay` seconds, or with `gather` until that many calls wait together,
        which tells parallel calls from sequential ones by count, not by a clock."""
        if not self.gather:
            time.sleep(self.delay)
            return
        with self._cond:
            self._held += 1
            self.most_at_once = max(self.most_at_once, self._held)
            if self._held >= self.gather:
                self._released = True
                self._cond.notify_all()
            self._cond.wait_for(lambda: self._released, timeout=self.delay)
            self._held -= 1


@dataclass
class Operation:
    """A long-running operation: done at `done_at`; then `finish()` runs and its status is final."""

    id: str
    done_at: float
    finish: Callable[[], None] | None = None
    error: dict[str, str] | None = None
    resource_path: str | None = None  # PUT: where the final GET goes
    done: bool = False


@dataclass
class Resource:
    id: str  # canonical casing as first written
    type: str  # "Microsoft.Network/virtualNetworks"
    body: dict[str, Any]
    rg: str | None  # lower-case resource group key ("sub/rg"), None for subscription-level
    created: float = field(default_factory=time.time)
    secret: dict[str, Any] = field(default_factory=dict)  # write-only inputs (VM custom data)


class FakeArm:
    """The server and its state. Thread-safe; every handler holds `self.lock` while it reads or
    changes state (never while it sleeps)."""

    def __init__(
        self,
        *,
        subscription_id: str = DEFAULT_SUBSCRIPTION,
        tenant_id: str = DEFAULT_TENANT,
        storage_key: str = AZURITE_KEY,
        op_seconds: float = 0.02,
        retry_after_ms: int = 10,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.subscription_id = subscription_id
        self.tenant_id = tenant_id
        self.storage_key = storage_key
        self.op_seconds = op_seconds
        self.retry_after_ms = retry_after_ms
        self.lock = threading.RLock()
        self.resource_groups: dict[str, Resource] = {}  # key "sub/rg" (lower)
        self.resources: dict[str, Resource] = {}  # key lower-case id
        self.operations: dict[str, Operation] = {}
        self.injections: list[Injection] = []
        self.calls: list[tuple[str, str, str]] = []  # (method, path, principal) of every ARM call
        self.bodies: list[tuple[str, dict[str, Any]]] = []  # (path, body) of every ARM PUT, as sent
        self.requests = 0  # every HTTP request, polls included
        self.power: dict[str, str] = {}  # vm id (lower) -> "running" | "stopped" | ...
        self.preempted: set[str] = set()  # vm ids (lower) whose Scheduled Events say Preempt
        self.run_commands: list[tuple[str, list[str]]] = []  # (vm id, script) of each runCommand
        self.listeners: list[Callable[[str, Resource], None]] = []
        self.tokens: dict[str, str] = {}  # bearer token -> principal
        self.audiences: dict[str, str] = {}  # IMDS-issued token -> the `resource` it was asked for
        self.revoked = False  # every token issued so far, and from now on, is refused (a revoked secret)
        self.storage_token_seconds = 3600  # the life of a VM's storage token (IMDS: about a day)
        self.storage_tokens = 0  # storage tokens issued
        self.subscription_state = "Enabled"  # ARM: Enabled | Warned | PastDue | Disabled | Deleted
        # The operator's role ({"actions": [...], "notActions": [...]}, a custom role's permissions):
        # None lets the operator do anything; set, each call's action must be in it (arm_actions.py).
        self.operator_role: dict[str, list[str]] | None = None
        self.role_definitions: dict[str, dict[str, Any]] = {}  # custom roles by path (lower)
        self.deleted_containers: list[str] = []  # Blob Containers - Delete calls ARM authorised
        self.actions: list[str | None] = []  # the action of every authorised-or-not operator call
        self.quotas = Quotas()  # vCPU limits per location (azure_quota.py): usages, QuotaExceeded
        self.images = Images()  # marketplace image versions and their OS disk sizes (azure_images.py)
        self.page_size: int | None = None  # listings of resource groups come in pages of this many
        self._ip_counter = itertools.count(4)
        self._stop = threading.Event()
        handler = type("Handler", (_Handler,), {"arm": self})
        self.server = _Server((host, port), handler)
        self._threads: list[threading.Thread] = []

    # ---- lifecycle ----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeArm:
        serve = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-arm", daemon=True
        )
        tick = threading.Thread(target=self._ticker, name="fake-arm-ops", daemon=True)
        for t in (serve, tick):
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeArm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def client_env(self) -> dict[str, str]:
        """Environment that points a gpucloud CLI subprocess at this server (credential included)."""
        return {
            "GPUCLOUD_AZURE_ARM_ENDPOINT": self.url,
            "AZURE_SUBSCRIPTION_ID": self.subscription_id,
            "IDENTITY_ENDPOINT": f"{self.url}/_identity",
            "IDENTITY_HEADER": IDENTITY_HEADER,
        }

    def preempt(self, vm_id: str) -> None:
        """Azure's eviction of a Spot VM: its Scheduled Events show a `Preempt` event from now on."""
        with self.lock:
            self.preempted.add(vm_id.lower())

    def imds_endpoint(self, principal_id: str) -> str:
        """The IMDS base URL of the VM whose system-assigned identity is `principal_id`."""
        return f"{self.url}/_imds/{principal_id}"

    # ---- test controls ------------------------------------------------------------------------
    def inject(
        self,
        method: str,
        path: str,
        code: str | None = "InternalServerError",
        *,
        message: str = "",
        status: int | None = None,
        times: int = 1,
        async_: bool = False,
        delay: float = 0.0,
        principal: str | None = None,
        op_seconds: float | None = None,
        query: str | None = None,
        gather: int = 0,
    ) -> Injection:
        """Arm a failure (or, with code=None, a stall: `delay` for the request itself,
        `op_seconds` for the long-running operation it starts) for matching calls."""
        inj = Injection(
            method=method.upper(),
            path=re.compile(path, re.I),
            code=code,
            message=message or f"Injected {code}.",
            status=status or _STATUS_BY_CODE.get(code or "", 400),
            times=times,
            async_=async_,
            delay=delay,
            principal=principal,
            op_seconds=op_seconds,
            query=re.compile(query, re.I) if query else None,
            gather=gather,
        )
        with self.lock:
            self.injections.append(inj)
        return inj

    def clear_injections(self) -> None:
        with self.lock:
            self.injections.clear()

    def reset(self) -> None:
        """Forget everything (between tests that share the server)."""
        with self.lock:
            for res in list(self.resources.values()):
                self._emit("deleted", res)
            self.resource_groups.clear()
            self.resources.clear()
            self.operations.clear()
            self.injections.clear()
            self.calls.clear()
            self.bodies.clear()
            self.audiences.clear()
            self.requests = 0
            self.power.clear()
            self.preempted.clear()
            self.run_commands.clear()
            self.revoked = False
            self.storage_token_seconds = 3600
            self.storage_tokens = 0
            self.subscription_state = "Enabled"
            self.operator_role = None
            self.actions.clear()
            self.role_definitions.clear()
            self.deleted_containers.clear()
            self.quotas.clear()
            self.images.clear()
            self.page_size = None

    def on_event(self, callback: Callable[[str, Resource], None]) -> None:
        """callback(event, resource) for "vm_created" and "deleted" (called with the lock held:
        keep it short, hand work to a thread)."""
        self.listeners.append(callback)

    def set_power_state(self, vm_id: str, state: str) -> None:
        """What the hypervisor says about a VM ("running", "stopped", "deallocated" ...)."""
        with self.lock:
            if vm_id.lower() in self.resources:
                self.power[vm_id.lower()] = state

    def snapshot(self, *, include_deleting: bool = True) -> list[dict[str, Any]]:
        """Everything that exists: resource groups and the resources in them, with tags."""
        with self.lock:
            self._finish_due()
            out = []
            for rg in self.resource_groups.values():
                state = rg.body["properties"]["provisioningState"]
                if include_deleting or state != "Deleting":
                    out.append({"id": rg.id, "type": rg.type, "tags": dict(rg.body.get("tags") or {}), "state": state})
            for res in self.resources.values():
                out.append(
                    {
                        "id": res.id,
                        "type": res.type,
                        "tags": dict(res.body.get("tags") or {}),
                        "state": (res.body.get("properties") or {}).get("provisioningState", "Succeeded"),
                    }
                )
            return out

    def vms(self) -> list[Resource]:
        with self.lock:
            return [r for r in self.resources.values() if r.type.lower() == "microsoft.compute/virtualmachines"]

    def custom_data(self, vm_id: str) -> str | None:
        """The decoded custom data a VM was created with (write-only in the real API, as here)."""
        with self.lock:
            res = self.resources.get(vm_id.lower())
            raw = res.secret.get("customData") if res else None
        return base64.b64decode(raw).decode() if raw else None

    # ---- internals ----------------------------------------------------------------------------
    def _emit(self, event: str, res: Resource) -> None:
        for cb in list(self.listeners):
            try:
                cb(event, res)
            except Exception:  # a listener's bug must not break the server
                pass

    def _ticker(self) -> None:
        while not self._stop.wait(0.02):
            with self.lock:
                self._finish_due()

    def _finish_due(self) -> None:
        now = time.time()
        for op in list(self.operations.values()):
            if not op.done and op.done_at <= now:
                op.done = True
                if op.finish is not None and op.error is None:
                    op.finish()

    def new_operation(
        self,
        *,
        finish: Callable[[], None] | None = None,
        error: dict[str, str] | None = None,
        resource_path: str | None = None,
        seconds: float | None = None,
    ) -> Operation:
        took = self.op_seconds if seconds is None else seconds
        op = Operation(
            id=uuid.uuid4().hex, done_at=time.time() + took, finish=finish, error=error, resource_path=resource_path
        )
        self.operations[op.id] = op
        return op

    def issue_token(self, principal: str, audience: str | None = None) -> str:
        token = f"fake.{principal}.{uuid.uuid4().hex}"
        with self.lock:
            self.tokens[token] = principal
            if audience is not None:
                self.audiences[token] = audience
        return token

    def issue_storage_token(self, principal: str, now: int) -> str:
        """A storage token of a VM's identity: a JWT whose `oid` names the principal (the blob
        front looks it up here; Azurite checks its issuer, audience and times)."""
        header = _b64url(json.dumps({"alg": "RS256", "typ": "JWT"}).encode())
        claims = {
            "aud": STORAGE_AUDIENCE,
            "iss": f"https://sts.windows.net/{self.tenant_id}/",
            "iat": now,
            "nbf": now - 300,
            "exp": now + self.storage_token_seconds,
            "oid": principal,
            "tid": self.tenant_id,
            "uti": uuid.uuid4().hex,
        }
        token = f"{header}.{_b64url(json.dumps(claims).encode())}.{_b64url(b'fake-arm-unsigned')}"
        with self.lock:
            self.tokens[token] = principal
            self.audiences[token] = STORAGE_AUDIENCE
            self.storage_tokens += 1
        return token

    def audience_ok(self, token: str) -> bool:
        """A VM's token is for this ARM's audience (its URL, as Azure's is https://management.azure.com/),
        or ARM refuses it: a node that asks IMDS for another cloud's audience cannot delete anything."""
        with self.lock:
            audience = self.audiences.get(token)
        return audience is None or audience.rstrip("/") == self.url

    def principal_of(self, token: str) -> str | None:
        with self.lock:
            return None if self.revoked else self.tokens.get(token)

    def vm_by_principal(self, principal: str) -> Resource | None:
        for res in self.vms():
            if (res.body.get("identity") or {}).get("principalId") == principal:
                return res
        return None

    def role_refuses(self, principal: str, method: str, path: str) -> str | None:
        """ARM's refusal message when the operator's role (`operator_role`) lacks the call's action."""
        from tests.support.arm_actions import action_of, allowed, denied_message

        if principal != OPERATOR_PRINCIPAL:
            return None
        action = action_of(method, path)
        with self.lock:
            self.actions.append(action)
            role = self.operator_role
        if role is None or allowed(action, role.get("actions", []), role.get("notActions", [])):
            return None
        return denied_message(principal, action, path)

    def role_permissions(self, role_definition_id: str) -> dict[str, list[str]] | None:
        """The permissions of a role by its definition id (a built-in one, or a custom one PUT
        here); None when no such role exists."""
        name = role_definition_id.rstrip("/").rsplit("/", 1)[-1].lower()
        if name in BUILTIN_ROLES:
            return BUILTIN_ROLES[name]
        with self.lock:
            for key, doc in self.role_definitions.items():
                if key.endswith(f"/roledefinitions/{name}"):
                    perms = (doc.get("properties") or {}).get("permissions") or [{}]
                    return {k: list(perms[0].get(k) or []) for k in BUILTIN_ROLES[CONTRIBUTOR_ROLE]}
        return None

    def authorized(self, principal: str, path: str, method: str = "GET") -> bool:
        """The operator may do anything; a VM identity only under a scope it has a role on: any
        call with Contributor, else an action among its role's Actions (a data-only role: none)."""
        from tests.support.arm_actions import action_of, allowed

        if principal == OPERATOR_PRINCIPAL:
            return True
        lower = path.lower().rstrip("/")
        for props in self.assignments_of(principal):
            role = str(props.get("roleDefinitionId", ""))
            scope = str(props.get("scope", "")).lower().rstrip("/")
            if not (lower == scope or lower.startswith(scope + "/")):
                continue
            if role.lower().endswith(CONTRIBUTOR_ROLE):
                return True
            perms = self.role_permissions(role)
            if perms and allowed(action_of(method, path), perms["actions"], perms["notActions"]):
                return True
        return False

    def assignments_of(self, principal: str) -> list[dict[str, Any]]:
        """The properties of every role assignment of `principal`."""
        with self.lock:
            return [
                dict(r.body.get("properties") or {})
                for r in self.resources.values()
                if r.type.lower() == "microsoft.authorization/roleassignments"
                and (r.body.get("properties") or {}).get("principalId") == principal
            ]

    def live_vm_bodies(self) -> list[dict[str, Any]]:
        """The bodies of the VMs that hold quota: not in a group being deleted (lock held)."""
        out = []
        for res in self.resources.values():
            if res.type.lower() != VM_TYPE:
                continue
            group = self.resource_groups.get(res.rg or "")
            if group is not None and group.body["properties"].get("provisioningState") == "Deleting":
                continue
            out.append(res.body)
        return out

    def retry_headers(self) -> dict[str, str]:
        """How long clients should wait before polling or retrying. Azure SDKs read `Retry-After`
        as whole seconds (and 0 as "use your own interval"), so sub-second waits go in the
        `retry-after-ms` header, which azure-core honours as well."""
        return {"retry-after-ms": str(self.retry_after_ms)}

    def next_ip(self, prefix: str) -> str:
        return f"{prefix}{next(self._ip_counter) % 250 + 4}"


def _token_doc(token: str, now: int, seconds: int, resource: str) -> dict[str, Any]:
    """IMDS's token response (strings, as IMDS sends them)."""
    return {
        "access_token": token,
        "refresh_token": "",
        "expires_in": str(seconds),
        "expires_on": str(now + seconds),
        "not_before": str(now),
        "resource": resource,
        "token_type": "Bearer",
    }


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def jwt_claims(token: str) -> dict[str, Any] | None:
    """The payload of a JWT (signature not checked: the fake's own tokens are looked up instead)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return None
    return claims if isinstance(claims, dict) else None


def _arm_error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def _type_of(ns: str, rest: str) -> tuple[str, str]:
    """ARM type and name from the part after /providers/: ns/type/name[/subtype/subname]..."""
    parts = rest.split("/")
    types = [ns] + [parts[i] for i in range(0, len(parts), 2)]
    return "/".join(types), parts[-1]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that hang up (a killed CLI) are normal here; anything else is printed."""
        import sys

        exc = sys.exc_info()[1]
        if not isinstance(exc, (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    arm: FakeArm
    protocol_version = "HTTP/1.1"
    _op_seconds: float | None = None  # set per request by an `op_seconds` injection
    server_version = "FakeARM/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # ---- plumbing -----------------------------------------------------------------------------
    def _send(self, status: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-ms-request-id", uuid.uuid4().hex)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if data and self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        self._send(status, _arm_error(code, message), headers)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        try:
            doc = json.loads(raw)
        except ValueError:
            return {}
        return doc if isinstance(doc, dict) else {}

    def do_GET(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        split = urlsplit(self.path)
        path = split.path.rstrip("/") or "/"
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        body = self._body() if self.command in ("PUT", "POST", "PATCH") else {}
        with self.arm.lock:
            self.arm.requests += 1
        try:
            if path.startswith("/_fake/"):
                return self._control(path, body)
            if path == "/_identity":
                return self._app_service_token(query)
            m = _IMDS_RE.match(path)
            if m:
                return self._imds(m["principal"], m["what"], query)
            self._arm(path, query, body)
        except BrokenPipeError:
            pass

    # ---- token endpoints ----------------------------------------------------------------------
    def _app_service_token(self, query: dict[str, str]) -> None:
        if self.headers.get("X-IDENTITY-HEADER") != IDENTITY_HEADER:
            return self._send(401, {"error": "unauthorized", "error_description": "bad X-IDENTITY-HEADER"})
        token = self.arm.issue_token(OPERATOR_PRINCIPAL)
        self._send(
            200,
            {
                "access_token": token,
                "expires_on": str(int(time.time()) + 3600),
                "resource": query.get("resource", ""),
                "token_type": "Bearer",
                "client_id": "00000000-0000-0000-0000-0000000c11e0",
            },
        )

    def _imds(self, principal: str, what: str, query: dict[str, str]) -> None:
        if self.headers.get("Metadata", "").lower() != "true":
            return self._send(
                400, {"error": "invalid_request", "error_description": "Required metadata header not specified"}
            )
        vm = self.arm.vm_by_principal(principal)
        if vm is None:
            return self._send(400, {"error": "invalid_request", "error_description": "Identity not found"})
        if what == "scheduledevents":  # Azure's eviction notice: a Preempt event once preempt(vm) was called
            with self.arm.lock:
                evicted = vm.id.lower() in self.arm.preempted
            events = [
                {
                    "EventId": f"preempt-{vm.id.split('/')[-1]}",
                    "EventType": "Preempt",
                    "ResourceType": "VirtualMachine",
                    "Resources": [vm.id.split("/")[-1]],
                    "EventStatus": "Scheduled",
                    "NotBefore": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30)),
                }
            ]
            return self._send(200, {"DocumentIncarnation": 2 if evicted else 1, "Events": events if evicted else []})
        if what.startswith("instance"):
            rg = vm.id.split("/")[4]
            compute = {
                "subscriptionId": self.arm.subscription_id,
                "resourceGroupName": rg,
                "name": vm.id.split("/")[-1],
                "location": vm.body.get("location"),
                "vmId": vm.body["properties"].get("vmId"),
                "vmSize": vm.body["properties"].get("hardwareProfile", {}).get("vmSize"),
                "resourceId": vm.id,
                "tagsList": [{"name": k, "value": v} for k, v in (vm.body.get("tags") or {}).items()],
            }
            return self._send(200, compute if what == "instance/compute" else {"compute": compute})
        resource = query.get("resource", "")
        now = int(time.time())
        if resource.rstrip("/") == STORAGE_AUDIENCE:  # a JWT, as Azurite's OAuth mode reads one
            token = self.arm.issue_storage_token(principal, now)
            return self._send(200, _token_doc(token, now, self.arm.storage_token_seconds, resource))
        token = self.arm.issue_token(principal, audience=resource)
        self._send(
            200,
            {
                "access_token": token,
                "refresh_token": "",
                "expires_in": "3600",
                "expires_on": str(now + 3600),
                "not_before": str(now),
                "resource": query.get("resource", ""),
                "token_type": "Bearer",
            },
        )

    # ---- out-of-process control ---------------------------------------------------------------
    def _control(self, path: str, body: dict[str, Any]) -> None:
        if path == "/_fake/snapshot":
            return self._send(200, self.arm.snapshot())
        if path == "/_fake/calls":
            with self.arm.lock:
                return self._send(200, [list(c) for c in self.arm.calls])
        if path == "/_fake/reset" and self.command == "POST":
            self.arm.reset()
            return self._send(204)
        if path == "/_fake/inject" and self.command == "POST":
            self.arm.inject(
                body["method"],
                body["path"],
                body.get("code", "InternalServerError"),
                message=body.get("message", ""),
                status=body.get("status"),
                times=int(body.get("times", 1)),
                async_=bool(body.get("async", False)),
                delay=float(body.get("delay", 0)),
                op_seconds=float(body["op_seconds"]) if body.get("op_seconds") is not None else None,
            )
            return self._send(204)
        self._error(404, "NotFound", f"no control endpoint {path}")

    # ---- ARM ----------------------------------------------------------------------------------
    def _arm(self, path: str, query: dict[str, str], body: dict[str, Any]) -> None:
        arm = self.arm
        self._op_seconds = None  # one handler serves every request of a keep-alive connection
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("Bearer "):  # ARM's answers, with the challenge header it sends
            return self._error(
                401,
                "AuthenticationFailed",
                "Authentication failed. The 'Authorization' header is missing.",
                {"WWW-Authenticate": 'Bearer authorization_uri="https://login.windows.net/", error="invalid_token"'},
            )
        principal = arm.principal_of(auth[7:])
        if principal is None:
            return self._error(
                401,
                "InvalidAuthenticationToken",
                "The access token is invalid.",
                {"WWW-Authenticate": 'Bearer authorization_uri="https://login.windows.net/", error="invalid_token"'},
            )
        if not arm.audience_ok(auth[7:]):
            return self._error(
                401, "InvalidAuthenticationTokenAudience", "The access token has been obtained for wrong audience."
            )
        if "api-version" not in query:
            return self._error(
                400,
                "MissingApiVersionParameter",
                "The api-version query parameter (?api-version=) is required for all requests.",
            )
        is_poll = bool(_OP_RE.match(path) or _RG_OPRESULT_RE.match(path))
        if not is_poll:
            with arm.lock:
                arm.calls.append((self.command, path, principal))
                if self.command == "PUT":
                    arm.bodies.append((path, json.loads(json.dumps(body))))
            refused = arm.role_refuses(principal, self.command, path)
            if refused is not None:
                return self._error(403, "AuthorizationFailed", refused)
            if not arm.authorized(principal, path, self.command):
                return self._error(
                    403,
                    "AuthorizationFailed",
                    f"The client '{principal}' does not have authorization to perform action "
                    f"'{self.command}' over scope '{path}' or the scope is invalid.",
                )
            inj = self._take_injection(path, principal, "&".join(f"{k}={v}" for k, v in query.items()))
            if inj is not None:
                if inj.delay:
                    inj.stall()
                if inj.code is not None and not inj.async_:
                    headers = arm.retry_headers() if inj.status == 429 or inj.status >= 500 else None
                    return self._error(inj.status, inj.code, inj.message, headers)
                if inj.code is not None and inj.async_:
                    return self._route(path, query, body, fail={"code": inj.code, "message": inj.message})
                self._op_seconds = inj.op_seconds
        self._route(path, query, body, fail=None)

    def _take_injection(self, path: str, principal: str, query: str = "") -> Injection | None:
        with self.arm.lock:
            for inj in self.arm.injections:
                if inj.principal is not None and inj.principal != principal:
                    continue
                if inj.query is not None and not inj.query.search(query):
                    continue
                if inj.times > 0 and inj.method in (self.command, "*") and inj.path.search(path):
                    inj.times -= 1
                    inj.hits += 1
                    return inj
        return None

    def _route(self, path: str, query: dict[str, str], body: dict[str, Any], *, fail: dict[str, str] | None) -> None:
        m = _OP_RE.match(path)
        if m:
            return self._poll(m[2], location_style=m[1].lower() == "operationresults")
        m = _RG_OPRESULT_RE.match(path)
        if m:
            return self._poll(m[1], location_style=True)
        m = _RG_LIST_RE.match(path)
        if m and self.command == "GET":
            return self._list_rgs(m[1], query)
        m = _SUB_RE.match(path)
        if m and self.command == "GET":  # `gpucloud check`: whose subscription, which locations
            return self._subscription(m[1], locations=bool(m[2]))
        m = VERSIONS_RE.match(path)
        if m and self.command == "GET":  # VirtualMachineImages - List/Get: an image's OS disk size
            status, doc = self.arm.images.answer(m, query)
            return self._send(status, doc)
        m = _USAGES_RE.match(path)
        if m and self.command == "GET":  # Usage - List: the quota before a launch, `gpucloud check`
            return self._usages(m[1], m[2])
        m = _RG_RE.match(path)
        if m:
            return self._rg(m[1], m[2], path, body, fail)
        m = _RG_RESOURCES_RE.match(path)
        if m and self.command == "GET":
            return self._list_in_rg(m[1], m[2], None)
        m = _ROLEDEF_RE.match(path)
        if m:
            return self._role_definition(path, m[1], m[2], body)
        m = _ROLE_RE.match(path)
        if m:
            return self._role_assignment(path, m["scope"], m["name"], body, fail)
        m = _ROLE_LIST_RE.match(path)
        if m and self.command == "GET":
            return self._list_role_assignments(m["scope"])
        m = _CONTAINER_RE.match(path)
        if m:
            return self._container(path, m["account"], m["name"])
        m = _NESTED_RE.match(path)
        if m:
            return self._nested(path, m["sub"], m["rg"], m["ns"], m["rest"], query, body, fail)
        self._error(404, "InvalidResourceType", f"The fake ARM server does not know {self.command} {path}.")

    def _subscription(self, sub: str, *, locations: bool) -> None:
        if sub.lower() != self.arm.subscription_id.lower():
            return self._error(404, "SubscriptionNotFound", f"The subscription '{sub}' could not be found.")
        if locations:
            return self._send(200, {"value": [{"name": n, "displayName": n, "type": "Region"} for n in FAKE_LOCATIONS]})
        return self._send(  # Subscriptions - Get (api-version 2022-12-01), every field ARM returns
            200,
            {
                "id": f"/subscriptions/{sub}",
                "authorizationSource": "RoleBased",
                "managedByTenants": [],
                "subscriptionId": sub,
                "tenantId": self.arm.tenant_id,
                "displayName": "fake subscription",
                "state": self.arm.subscription_state,
                "subscriptionPolicies": {
                    "locationPlacementId": "Public_2014-09-01",
                    "quotaId": "PayAsYouGo_2014-09-01",
                    "spendingLimit": "Off",
                },
            },
        )

    def _usages(self, sub: str, location: str) -> None:
        if sub.lower() != self.arm.subscription_id.lower():
            return self._error(404, "SubscriptionNotFound", f"The subscription '{sub}' could not be found.")
        with self.arm.lock:
            vms = self.arm.live_vm_bodies()
        self._send(200, {"value": self.arm.quotas.usages(location, vms)})

    # ---- long-running operations ----------------------------------------------------------------
    def _poll(self, op_id: str, *, location_style: bool) -> None:
        arm = self.arm
        with arm.lock:
            arm._finish_due()
            op = arm.operations.get(op_id)
            if op is None:
                return self._error(404, "OperationNotFound", f"operation {op_id} not found")
            if not op.done:
                if location_style:
                    return self._send(202, None, {"Location": self._op_url(op, location=True), **arm.retry_headers()})
                return self._send(200, {"status": "InProgress"}, {**arm.retry_headers()})
            if op.error is not None:
                if location_style:
                    return self._send(_STATUS_BY_CODE.get(op.error["code"], 400), {"error": op.error})
                return self._send(200, {"status": "Failed", "error": op.error})
            if location_style:
                return self._send(200, self._resource_body(op.resource_path) if op.resource_path else None)
            return self._send(200, {"status": "Succeeded"})

    def _op_url(
        self, op: Operation, *, location: bool = False, ns: str = "Microsoft.Resources", loc: str = "eastus"
    ) -> str:
        kind = "operationresults" if location else "operations"
        return (
            f"{self.arm.url}/subscriptions/{self.arm.subscription_id}/providers/{ns}/locations/{loc}/{kind}/{op.id}"
            "?api-version=2024-01-01"
        )

    def _resource_body(self, path: str) -> dict[str, Any] | None:
        res = self.arm.resources.get(path.lower())
        return _public(res) if res else None

    def _async_created(
        self,
        status: int,
        res_path: str,
        ns: str,
        location: str,
        fail: dict[str, str] | None,
        finish: Callable[[], None] | None,
        body: dict[str, Any],
        *,
        location_header: bool = False,
    ) -> None:
        op = self.arm.new_operation(finish=finish, error=fail, resource_path=res_path, seconds=self._op_seconds)
        headers = {**self.arm.retry_headers()}
        if location_header:
            headers["Location"] = self._op_url(op, location=True, ns=ns, loc=location or "eastus")
        else:
            headers["Azure-AsyncOperation"] = self._op_url(op, ns=ns, loc=location or "eastus")
        self._send(status, body, headers)

    # ---- resource groups ------------------------------------------------------------------------
    def _rg_key(self, sub: str, rg: str) -> str:
        return f"{sub}/{rg}".lower()

    def _list_rgs(self, sub: str, query: dict[str, str]) -> None:
        flt = query.get("$filter", "")
        tag_name = re.search(r"tagName eq '([^']*)'", flt)
        tag_value = re.search(r"tagValue eq '([^']*)'", flt)
        with self.arm.lock:
            self.arm._finish_due()
            out = []
            for rg in self.arm.resource_groups.values():
                tags = rg.body.get("tags") or {}
                if tag_name and tag_name[1] not in tags:
                    continue
                if tag_name and tag_value and tags.get(tag_name[1]) != tag_value[1]:
                    continue
                out.append(rg.body)
        size = self.arm.page_size
        if not size:
            return self._send(200, {"value": out})
        start = int(query.get("$skiptoken") or 0)
        page: dict[str, Any] = {"value": out[start : start + size]}
        if start + size < len(out):  # ARM's paging: `nextLink` with a skip token, as ARM gives one
            page["nextLink"] = (
                f"{self.arm.url}/subscriptions/{sub}/resourcegroups?api-version={query.get('api-version', '')}"
                f"&$filter={quote(query.get('$filter', ''))}&$skiptoken={start + size}"
            )
        self._send(200, page)

    def _rg(self, sub: str, name: str, path: str, body: dict[str, Any], fail: dict[str, str] | None) -> None:
        arm = self.arm
        key = self._rg_key(sub, name)
        with arm.lock:
            arm._finish_due()
            existing = arm.resource_groups.get(key)
            if self.command in ("GET", "HEAD"):
                if existing is None:
                    if self.command == "HEAD":
                        return self._send(404)
                    return self._error(404, "ResourceGroupNotFound", f"Resource group '{name}' could not be found.")
                return self._send(
                    204 if self.command == "HEAD" else 200, None if self.command == "HEAD" else existing.body
                )
            if self.command == "PUT":
                if not body.get("location"):
                    return self._error(
                        400, "LocationRequired", "The location property is required for this definition."
                    )
                if existing is not None:
                    if existing.body["properties"]["provisioningState"] == "Deleting":
                        return self._error(
                            409,
                            "ResourceGroupBeingDeleted",
                            f"The resource group '{name}' is in deprovisioning state and cannot "
                            "perform this operation.",
                        )
                    if existing.body["location"].lower() != body["location"].lower():
                        return self._error(
                            409,
                            "InvalidResourceGroupLocation",
                            f"Invalid resource group location '{body['location']}'. The Resource group "
                            f"already exists in location '{existing.body['location']}'.",
                        )
                rid = f"/subscriptions/{sub}/resourceGroups/{name}"
                doc = {
                    "id": rid,
                    "name": name,
                    "type": "Microsoft.Resources/resourceGroups",
                    "location": body["location"],
                    "tags": body.get("tags") or {},
                    "properties": {"provisioningState": "Succeeded"},
                }
                arm.resource_groups[key] = Resource(
                    id=rid, type="Microsoft.Resources/resourceGroups", body=doc, rg=None
                )
                return self._send(200 if existing else 201, doc)
            if self.command == "DELETE":
                if existing is None:
                    return self._error(404, "ResourceGroupNotFound", f"Resource group '{name}' could not be found.")
                if fail is not None:  # the deletion is accepted, then fails; nothing is deleted
                    op = arm.new_operation(error=fail)
                    return self._send(
                        202,
                        None,
                        {
                            "Location": f"{arm.url}/subscriptions/{sub}/operationresults/{op.id}"
                            "?api-version=2024-01-01",
                            **arm.retry_headers(),
                        },
                    )
                existing.body["properties"]["provisioningState"] = "Deleting"
                # Contents go at once (the VM stops), the group itself when the operation ends.
                prefix = existing.id.lower() + "/"
                for rid in [r for r in arm.resources if r.startswith(prefix)]:
                    res = arm.resources.pop(rid)
                    arm.power.pop(rid, None)
                    arm._emit("deleted", res)

                def finish() -> None:
                    if arm.resource_groups.get(key) is existing:
                        del arm.resource_groups[key]
                        arm._emit("deleted", existing)

                op = arm.new_operation(finish=finish, error=fail, seconds=self._op_seconds)
                return self._send(
                    202,
                    None,
                    {
                        "Location": f"{arm.url}/subscriptions/{sub}/operationresults/{op.id}?api-version=2024-01-01",
                        **arm.retry_headers(),
                    },
                )
        self._error(405, "MethodNotAllowed", f"{self.command} not supported on a resource group")

    def _list_in_rg(self, sub: str, rg: str, rtype: str | None) -> None:
        with self.arm.lock:
            self.arm._finish_due()
            if self._rg_key(sub, rg) not in self.arm.resource_groups:
                return self._error(404, "ResourceGroupNotFound", f"Resource group '{rg}' could not be found.")
            prefix = f"/subscriptions/{sub}/resourcegroups/{rg}/".lower()
            out = [
                self._view(r)
                for k, r in self.arm.resources.items()
                if k.startswith(prefix) and (rtype is None or r.type.lower() == rtype.lower())
            ]
        self._send(200, {"value": out})

    # ---- role assignments -----------------------------------------------------------------------
    def _role_assignment(
        self, path: str, scope: str, name: str, body: dict[str, Any], fail: dict[str, str] | None
    ) -> None:
        arm = self.arm
        with arm.lock:
            existing = arm.resources.get(path.lower())
            if self.command == "GET":
                if existing is None:
                    return self._error(404, "RoleAssignmentNotFound", f"The role assignment '{name}' is not found.")
                return self._send(200, existing.body)
            if self.command == "DELETE":
                if existing is None:
                    return self._send(204)
                del arm.resources[path.lower()]
                return self._send(200, existing.body)
            if self.command != "PUT":
                return self._error(405, "MethodNotAllowed", "")
            props = dict(body.get("properties") or {})
            m = re.match(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)", scope, re.I)
            if m is None or self._rg_key(m[1], m[2]) not in arm.resource_groups:
                return self._error(404, "ResourceGroupNotFound", f"The scope '{scope}' does not exist.")
            refused = self._scope_refused(scope) or self._role_refused(props)
            if refused is None and self.arm.role_permissions(str(props["roleDefinitionId"])) is None:
                refused = (
                    400,
                    "RoleDefinitionDoesNotExist",
                    f"The specified role definition with ID '{props['roleDefinitionId']}' does not exist.",
                )
            if refused is not None:
                return self._error(*refused)
            if arm.vm_by_principal(props["principalId"]) is None:
                return self._error(
                    400,
                    "PrincipalNotFound",
                    f"Principal {props['principalId']} does not exist in the directory {arm.tenant_id}.",
                )
            if existing is not None:
                return self._error(409, "RoleAssignmentExists", "The role assignment already exists.")
            props["scope"] = scope
            doc = {"id": path, "name": name, "type": "Microsoft.Authorization/roleAssignments", "properties": props}
            arm.resources[path.lower()] = Resource(
                id=path, type="Microsoft.Authorization/roleAssignments", body=doc, rg=self._rg_key(m[1], m[2])
            )
            self._send(201, doc)

    def _container(self, path: str, account: str, name: str) -> None:
        """Blob Containers - Get/Delete through ARM (the control plane): the data lives in Azurite,
        so a DELETE is recorded (`deleted_containers`) for the test to see who could do it."""
        with self.arm.lock:
            if account.lower() not in self.arm.resources:
                return self._error(404, "ResourceNotFound", f"The Resource '{account}' was not found.")
            if self.command == "DELETE":
                self.arm.deleted_containers.append(path)
                return self._send(200)
        if self.command == "GET":
            kind = "Microsoft.Storage/storageAccounts/blobServices/containers"
            return self._send(200, {"id": path, "name": name, "type": kind})
        return self._error(405, "MethodNotAllowed", "")

    def _scope_refused(self, scope: str) -> tuple[int, str, str] | None:
        """A scope below a resource group must name a resource that exists: a storage account's
        blob service or container (the channel's), or a group's own resources."""
        rest = re.sub(r"^/subscriptions/[^/]+/resourcegroups/[^/]+", "", scope, flags=re.I)
        if not rest:
            return None
        m = _STORAGE_SCOPE_RE.match(scope)
        target = m["account"] if m else scope
        if target.lower() not in self.arm.resources:
            return 404, "ResourceNotFound", f"The scope '{scope}' does not exist."
        return None

    @staticmethod
    def _role_refused(props: dict[str, Any]) -> tuple[int, str, str] | None:
        """ARM's checks of a role assignment's body: role and principal given; a condition only
        with conditionVersion 2.0 and a syntax it can read (abac.py: stricter than ARM)."""
        from tests.support.abac import ConditionError, check

        if not props.get("roleDefinitionId") or not props.get("principalId"):
            return 400, "InvalidRoleAssignmentRequest", "roleDefinitionId and principalId are required."
        condition = props.get("condition")
        if condition is None:
            return None
        if props.get("conditionVersion") != "2.0":
            return 400, "InvalidConditionVersion", "A condition needs conditionVersion 2.0."
        try:
            check(str(condition))
        except ConditionError as exc:
            return 400, "InvalidCondition", f"The condition is invalid: {exc}"
        return None

    def _list_role_assignments(self, scope: str) -> None:
        """Role Assignments - List For Scope / For Subscription: every assignment at or below the
        scope (no $filter)."""
        lower = scope.lower().rstrip("/")
        with self.arm.lock:
            out = [
                r.body
                for r in self.arm.resources.values()
                if r.type.lower() == "microsoft.authorization/roleassignments"
                and (r.id.lower() == lower or r.id.lower().startswith(lower + "/"))
            ]
        self._send(200, {"value": out})

    def _role_definition(self, path: str, sub: str, name: str, body: dict[str, Any]) -> None:
        """A custom role definition at subscription scope (`gpucloud setup azure`): GET, PUT, DELETE."""
        arm, key = self.arm, path.lower()
        with arm.lock:
            existing = arm.role_definitions.get(key)
            if self.command == "GET":
                if existing is None:
                    return self._error(
                        404, "RoleDefinitionDoesNotExist", "The specified role definition does not exist."
                    )
                return self._send(200, existing)
            if self.command == "DELETE":
                arm.role_definitions.pop(key, None)
                return self._send(200 if existing else 204, existing)
            props = dict(body.get("properties") or {})
            perms = props.get("permissions") or []
            scopes = [str(x).lower() for x in props.get("assignableScopes") or []]
            if not props.get("roleName") or not perms or f"/subscriptions/{sub}".lower() not in scopes:
                return self._error(
                    400, "InvalidRoleDefinition", "roleName, permissions and assignableScopes are required."
                )
            doc = {"id": path, "name": name, "type": "Microsoft.Authorization/roleDefinitions", "properties": props}
            arm.role_definitions[key] = doc
            self._send(200 if existing else 201, doc)

    # ---- resources in a group -------------------------------------------------------------------
    def _nested(
        self,
        path: str,
        sub: str,
        rg: str,
        ns: str,
        rest: str,
        query: dict[str, str],
        body: dict[str, Any],
        fail: dict[str, str] | None,
    ) -> None:
        arm = self.arm
        parts = rest.split("/")
        # Actions and sub-views: .../virtualMachines/{n}/instanceView, .../storageAccounts/{n}/listKeys
        if len(parts) % 2 == 1 and len(parts) >= 3:
            action = parts[-1].lower()
            target = path.rsplit("/", 1)[0]
            if action == "instanceview" and self.command == "GET":
                with arm.lock:
                    res = arm.resources.get(target.lower())
                    if res is None:
                        return self._error(404, "ResourceNotFound", f"The Resource '{target}' was not found.")
                    return self._send(200, self._instance_view(res))
            if action in ("deallocate", "generalize") and self.command == "POST":
                return self._vm_action(action, target, ns)
            if action == "runcommand" and self.command == "POST":
                return self._run_command(target, ns, body)
            if action == "listkeys" and self.command == "POST":
                with arm.lock:
                    if target.lower() not in arm.resources:
                        return self._error(404, "ResourceNotFound", f"The Resource '{target}' was not found.")
                return self._send(
                    200,
                    {
                        "keys": [
                            {"keyName": "key1", "value": arm.storage_key, "permissions": "FULL"},
                            {"keyName": "key2", "value": arm.storage_key, "permissions": "FULL"},
                        ]
                    },
                )
            if self.command == "GET":  # a child collection, e.g. .../virtualNetworks/{n}/subnets
                with arm.lock:
                    prefix = path.lower() + "/"
                    out = [
                        _public(r)
                        for k, r in arm.resources.items()
                        if k.startswith(prefix) and "/" not in k[len(prefix) :]
                    ]
                return self._send(200, {"value": out})
            return self._error(404, "InvalidResourceType", f"The fake ARM server does not know {self.command} {path}.")
        if len(parts) == 1:
            if self.command == "GET":
                return self._list_in_rg(sub, rg, f"{ns}/{parts[0]}")
            return self._error(405, "MethodNotAllowed", "")
        rtype, name = _type_of(ns, rest)
        key = path.lower()
        with arm.lock:
            arm._finish_due()
            group = arm.resource_groups.get(self._rg_key(sub, rg))
            existing = arm.resources.get(key)
            if self.command == "GET":
                if existing is None:
                    return self._error(
                        404,
                        "ResourceNotFound",
                        f"The Resource '{rtype}/{name}' under resource group '{rg}' was not found.",
                    )
                doc = self._view(existing)
                if query.get("$expand", "").lower() == "instanceview" and rtype.lower() == VM_TYPE:
                    doc["properties"]["instanceView"] = self._instance_view(existing)
                return self._send(200, doc)
            if self.command == "DELETE":
                if existing is None:
                    return self._send(204)
                if fail is not None:
                    op = arm.new_operation(error=fail)
                    return self._send(
                        202, None, {"Azure-AsyncOperation": self._op_url(op, ns=ns), **arm.retry_headers()}
                    )
                del arm.resources[key]
                for child in [k for k in arm.resources if k.startswith(key + "/")]:
                    arm.resources.pop(child)
                arm.power.pop(key, None)
                arm._emit("deleted", existing)
                op = arm.new_operation(error=fail)
                return self._send(202, None, {"Azure-AsyncOperation": self._op_url(op, ns=ns), **arm.retry_headers()})
            if self.command != "PUT":
                return self._error(405, "MethodNotAllowed", "")
            if group is None:
                return self._error(404, "ResourceGroupNotFound", f"Resource group '{rg}' could not be found.")
            if group.body["properties"]["provisioningState"] == "Deleting":
                return self._error(409, "ResourceGroupBeingDeleted", f"The resource group '{rg}' is being deleted.")
            problem = self._validate(rtype, body)
            if problem is None and rtype.lower() == VM_TYPE and existing is None:
                problem = arm.images.refusal(body) or arm.quotas.refusal(body, arm.live_vm_bodies())
            if problem:
                conflict = problem[0] in ("QuotaExceeded", "OperationNotAllowed")
                return self._error(409 if conflict else 400, problem[0], problem[1])
            rid = f"/subscriptions/{sub}/resourceGroups/{group.id.split('/')[-1]}/providers/{ns}/{rest}"
            res, secret = self._materialize(rid, rtype, name, body, existing)
            res_obj = Resource(id=rid, type=rtype, body=res, rg=self._rg_key(sub, rg), secret=secret)
            if rtype.lower() in SYNC_TYPES:  # e.g. proximity placement groups: done when the PUT answers
                if fail is not None:
                    return self._error(_STATUS_BY_CODE.get(fail["code"], 400), fail["code"], fail["message"])
                arm.resources[key] = res_obj
                # AvailabilitySets_CreateOrUpdate answers 200 only (its REST spec); placement groups 200/201.
                created = 201 if existing is None and rtype.lower() != AVSET_TYPE else 200
                return self._send(created, self._view(res_obj))
            created_state = "Creating" if existing is None else "Updating"
            res_obj.body.setdefault("properties", {})["provisioningState"] = created_state
            arm.resources[key] = res_obj
            if rtype.lower() == "microsoft.network/virtualnetworks":
                for sn in res["properties"].get("subnets", []):
                    arm.resources[sn["id"].lower()] = Resource(
                        id=sn["id"], type=f"{rtype}/subnets", body=sn, rg=res_obj.rg
                    )

            def finish() -> None:
                if arm.resources.get(key) is res_obj:
                    res_obj.body["properties"]["provisioningState"] = "Succeeded"
                    if rtype.lower() == "microsoft.compute/virtualmachines":
                        arm.power[key] = "running"
                        arm._emit("vm_created", res_obj)
                    elif rtype.lower() == "microsoft.compute/virtualmachines/extensions":
                        arm._emit("extension_created", res_obj)

            if fail is not None:
                # A failed creation leaves the resource in Failed state (as ARM does for VMs).
                res_obj.body["properties"]["provisioningState"] = "Failed"
            status = 200 if existing else 201
            is_storage = rtype.lower() == "microsoft.storage/storageaccounts"
            if is_storage:  # the Storage RP answers 202 with only a Location header
                return self._async_created(
                    202, key, ns, res.get("location", ""), fail, finish, None, location_header=True
                )
            return self._async_created(status, key, ns, res.get("location", ""), fail, finish, _public(res_obj))

    def _run_command(self, target: str, ns: str, body: dict[str, Any]) -> None:
        """POST .../virtualMachines/{n}/runCommand (long-running): the guest agent runs the script as
        root; a VM that is not running cannot (409). The script is recorded in `run_commands`."""
        arm = self.arm
        with arm.lock:
            res = arm.resources.get(target.lower())
            if res is None:
                return self._error(404, "ResourceNotFound", f"The Resource '{target}' was not found.")
            if arm.power.get(target.lower(), "running") != "running":
                return self._error(409, "OperationNotAllowed", "Run command requires the VM to be running.")
            if body.get("commandId") != "RunShellScript" or not isinstance(body.get("script"), list):
                return self._error(400, "InvalidParameter", "commandId RunShellScript and a script list are required.")
            arm.run_commands.append((target, list(body["script"])))
            op = arm.new_operation()
        return self._send(202, None, {"Azure-AsyncOperation": self._op_url(op, ns=ns), **arm.retry_headers()})

    def _vm_action(self, action: str, target: str, ns: str) -> None:
        """POST .../virtualMachines/{n}/deallocate (long-running: the VM stops, still exists) and
        .../generalize (synchronous; Azure requires a deallocated VM), what a managed image needs."""
        arm = self.arm
        with arm.lock:
            res = arm.resources.get(target.lower())
            if res is None:
                return self._error(404, "ResourceNotFound", f"The Resource '{target}' was not found.")
            if action == "generalize":
                if arm.power.get(target.lower()) != "deallocated":
                    return self._error(409, "OperationNotAllowed", "The VM must be deallocated to be generalized.")
                res.body.setdefault("properties", {})["generalized"] = True
                return self._send(200, None)
            arm.power[target.lower()] = "deallocated"
            op = arm.new_operation()
        arm._emit("deallocated", res)
        return self._send(202, None, {"Azure-AsyncOperation": self._op_url(op, ns=ns), **arm.retry_headers()})

    def _validate(self, rtype: str, body: dict[str, Any]) -> tuple[str, str] | None:
        """The few checks ARM makes that matter to gpucloud (references exist, sizes, limits)."""
        props = body.get("properties") or {}
        t = rtype.lower()
        if t != "microsoft.network/virtualnetworks/subnets" and not body.get("location"):
            return ("LocationRequired", "The location property is required for this definition.")
        refs: list[str] = []
        if t == "microsoft.network/networkinterfaces":
            for ipc in props.get("ipConfigurations", []):
                p = ipc.get("properties") or {}
                refs += [x["id"] for x in (p.get("subnet"), p.get("publicIPAddress")) if x and x.get("id")]
            if (props.get("networkSecurityGroup") or {}).get("id"):
                refs.append(props["networkSecurityGroup"]["id"])
        if t == "microsoft.compute/virtualmachines":
            refs += [n["id"] for n in (props.get("networkProfile") or {}).get("networkInterfaces", [])]
            if not (props.get("hardwareProfile") or {}).get("vmSize"):
                return ("InvalidParameter", "Required parameter 'hardwareProfile.vmSize' is missing (null).")
            custom = (props.get("osProfile") or {}).get("customData") or ""
            if len(custom) > CUSTOM_DATA_MAX_B64:
                return (
                    "InvalidParameter",
                    "Custom data in OSProfile must be in Base64 encoding and with a maximum "
                    "length of 87380 characters.",
                )
            problem = self._vm_placement(props, body)
            if problem:
                return problem
            linux = (props.get("osProfile") or {}).get("linuxConfiguration") or {}
            keys = ((linux.get("ssh") or {}).get("publicKeys")) or []
            if linux.get("disablePasswordAuthentication") and not keys:
                return (
                    "InvalidParameter",
                    "Destination path for SSH public keys is required when password authentication is disabled.",
                )
        if t == "microsoft.compute/images":  # Trusted Launch does not support managed images (trusted-launch.md)
            source = self.arm.resources.get(str((props.get("sourceVirtualMachine") or {}).get("id", "")).lower())
            security = ((source.body.get("properties") or {}).get("securityProfile") or {}) if source else {}
            if security.get("securityType") == "TrustedLaunch":
                return (
                    "OperationNotAllowed",
                    "Managed image creation is not supported for a virtual machine with securityType TrustedLaunch; "
                    "use an Azure Compute Gallery image instead.",
                )
        for ref in refs:
            if ref.lower() not in self.arm.resources:
                return ("InvalidResourceReference", f"Resource {ref} referenced by the request was not found.")
        return None

    def _vm_placement(self, props: dict[str, Any], body: dict[str, Any]) -> tuple[str, str] | None:
        """A VM's proximity placement group and availability set exist in its location and agree;
        spot VMs stay out of availability sets; accelerated networking only on sizes that have it."""
        ppg_ref = (props.get("proximityPlacementGroup") or {}).get("id")
        if ppg_ref:
            ppg = self.arm.resources.get(ppg_ref.lower())
            if ppg is None:
                return (
                    "NotFound",
                    f"The entity was not found in this Azure location. Resource {ppg_ref} "
                    "referenced by the request was not found.",
                )
            if str(ppg.body.get("location", "")).lower() != str(body.get("location", "")).lower():
                return (
                    "InvalidParameter",
                    f"Proximity placement group {ppg_ref} is in location "
                    f"'{ppg.body.get('location')}', not '{body.get('location')}'.",
                )
            if ppg.body.get("zones") and sorted(body.get("zones") or []) != sorted(ppg.body["zones"]):
                return (
                    "InvalidParameter",
                    f"The zones of the virtual machine must match those of proximity "
                    f"placement group {ppg_ref} ({ppg.body['zones']}).",
                )
        avset_ref = (props.get("availabilitySet") or {}).get("id")
        if avset_ref:
            avset = self.arm.resources.get(avset_ref.lower())
            if avset is None:
                return ("NotFound", f"Resource {avset_ref} referenced by the request was not found.")
            if props.get("priority") == "Spot":
                return (
                    "AzureSpotVMNotSupportedInAvailabilitySet",
                    "Azure Spot Virtual Machine is not supported in Availability Set.",
                )
            if str(avset.body.get("location", "")).lower() != str(body.get("location", "")).lower():
                return ("InvalidParameter", f"Availability set {avset_ref} is in another location.")
            if (avset.body.get("sku") or {}).get("name") != "Aligned":
                return (
                    "OperationNotAllowed",
                    "Addition of a VM with managed disks to non-managed Availability Set is not supported.",
                )
            set_ppg = ((avset.body.get("properties") or {}).get("proximityPlacementGroup") or {}).get("id", "")
            if ppg_ref and set_ppg.lower() != ppg_ref.lower():
                return (
                    "InvalidParameter",
                    f"The proximity placement group of the VM ({ppg_ref}) differs from that of availability set "
                    f"{avset_ref} ({set_ppg or 'none'}).",
                )
        size = str((props.get("hardwareProfile") or {}).get("vmSize", "")).lower()
        if (props.get("securityProfile") or {}).get("securityType") == "TrustedLaunch":
            sku = str(((props.get("storageProfile") or {}).get("imageReference") or {}).get("sku", "")).lower()
            if size in NO_TRUSTED_LAUNCH_SIZES or sku in GEN1_SKUS:
                return (
                    "BadRequest",
                    f"The VM size '{size}' or Generation 1 image '{sku}' is not supported for creation of VMs "
                    "with 'TrustedLaunch' security type.",
                )
        for nic_ref in (props.get("networkProfile") or {}).get("networkInterfaces", []):
            nic = self.arm.resources.get(str(nic_ref.get("id", "")).lower())
            accelerated = nic is not None and (nic.body.get("properties") or {}).get("enableAcceleratedNetworking")
            if accelerated and size in NO_ACCELERATED_NETWORKING:
                return (
                    "VMSizeIsNotPermittedToEnableAcceleratedNetworking",
                    f"VM size {size} is not compatible with enabling Accelerated Networking on NIC {nic_ref['id']}.",
                )
        return None

    def _materialize(
        self, rid: str, rtype: str, name: str, body: dict[str, Any], existing: Resource | None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The resource as ARM returns it: ids filled in, read-only properties computed."""
        doc = json.loads(json.dumps(body))
        doc.update({"id": rid, "name": name, "type": rtype})
        props = doc.setdefault("properties", {})
        secret: dict[str, Any] = {}
        t = rtype.lower()
        if t == "microsoft.network/virtualnetworks":
            for sn in props.get("subnets", []):
                sn["id"] = f"{rid}/subnets/{sn['name']}"
                sn["type"] = f"{rtype}/subnets"
                sn.setdefault("properties", {})["provisioningState"] = "Succeeded"
        elif t == "microsoft.network/publicipaddresses":
            props["ipAddress"] = self.arm.next_ip("20.62.0.")
        elif t == "microsoft.network/networkinterfaces":
            for ipc in props.get("ipConfigurations", []):
                ipc["id"] = f"{rid}/ipConfigurations/{ipc['name']}"
                ipc.setdefault("properties", {})["privateIPAddress"] = self.arm.next_ip("10.0.0.")
        elif t == "microsoft.compute/virtualmachines":
            osp = props.get("osProfile") or {}
            if "customData" in osp:
                secret["customData"] = osp.pop("customData")  # write-only, as in Azure
            props["vmId"] = existing.body["properties"]["vmId"] if existing else str(uuid.uuid4())
            ident = doc.get("identity") or {}
            if "SystemAssigned" in str(ident.get("type", "")):
                old = (existing.body.get("identity") or {}) if existing else {}
                ident["principalId"] = old.get("principalId") or str(uuid.uuid4())
                ident["tenantId"] = self.arm.tenant_id
                doc["identity"] = ident
        elif t == PPG_TYPE:
            props.setdefault("proximityPlacementGroupType", "Standard")
            props.pop("virtualMachines", None)  # read-only: computed from the VMs (see _view)
        elif t == "microsoft.storage/storageaccounts":
            props["primaryEndpoints"] = {"blob": f"https://{name}.blob.core.windows.net/"}
        return doc, secret

    def _view(self, res: Resource) -> dict[str, Any]:
        """The resource as a GET answers it: read-only references filled in (a proximity
        placement group lists the VMs in it)."""
        doc = _public(res)
        if res.type.lower() == PPG_TYPE:
            doc.setdefault("properties", {})["virtualMachines"] = [
                {"id": vm.id}
                for vm in self.arm.resources.values()
                if vm.type.lower() == VM_TYPE
                and str(((vm.body.get("properties") or {}).get("proximityPlacementGroup") or {}).get("id", "")).lower()
                == res.id.lower()
            ]
        return doc

    def _instance_view(self, res: Resource) -> dict[str, Any]:
        state = res.body["properties"].get("provisioningState", "Succeeded")
        power = self.arm.power.get(res.id.lower())
        statuses = [
            {
                "code": f"ProvisioningState/{state.lower()}",
                "level": "Info",
                "displayStatus": f"Provisioning {state.lower()}",
            }
        ]
        if power:
            statuses.append({"code": f"PowerState/{power}", "level": "Info", "displayStatus": f"VM {power}"})
        return {
            "computerName": (res.body["properties"].get("osProfile") or {}).get("computerName"),
            "statuses": statuses,
        }


def _public(res: Resource) -> dict[str, Any]:
    return json.loads(json.dumps(res.body))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="A fake Azure Resource Manager for gpucloud's tests.")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--host", default="127.0.0.1")
    args = ap.parse_args(argv)
    arm = FakeArm(host=args.host, port=args.port).start()
    print(f"fake ARM listening on {arm.url}", flush=True)
    for k, v in arm.client_env().items():
        print(f"export {k}={v}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        arm.stop()


if __name__ == "__main__":
    main()
