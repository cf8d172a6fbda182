"""The node's own access to its run's blobs: one role assignment per VM, the custom role `gpucloud
node channel` (rbac.py; made by `gpucloud setup azure`) on the region's channel container for the
VM's system-assigned identity, with an ABAC condition that admits reads under `runs/<run>/` and
writes only of what a node writes there (docs/PROVIDERS.md, "Azure node identity"). The agent uses
it with a token from the Azure IMDS (gpucloud/vm/agent/blob_token.py), so the run's channel
outlives the SAS URLs the CLI signed.

Why a custom role and not the built-in Storage Blob Data Contributor: that role also holds the
control-plane Actions containers/{read,write,delete} and generateUserDelegationKey, which no
condition narrows (conditions apply to data actions), so a job holding its VM's ARM token could
delete the region's whole channel container. The node role has blob data actions only (read,
write, add; no delete, no move), and the condition narrows them to the run. Where setup has not
made the role, the node keeps its SAS URLs and the run's journal says so.

Role assignments carry no tags. Each is journalled (kind `channel_access`) before its PUT, deleted
at teardown, and `gc` finds gpucloud's by their exact shape: this description, this condition, this
role, a channel container's scope; one whose run has no resource group left (its VMs and their
identities are gone) is deleted (`ended`).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from gpucloud.contract.tags import RUN_ID_RE
from gpucloud.providers.azure.arm import Arm
from gpucloud.providers.azure.channel import CONTAINER, storage_account_name, storage_group_name
from gpucloud.providers.azure.rbac import node_role_id
from gpucloud.providers.azure.roles import ROLE_ASSIGNMENTS_API, Assignment, assignment_body, put_assignment

if TYPE_CHECKING:
    from gpucloud.contract.provider import Journal

KIND = "channel_access"  # the journal's resource kind
BLOB = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs"
PATH = f"@Resource[{BLOB}:path]"
# What a node writes under runs/<run>/ (the AWS node role's list, with Azure's append blobs).
WRITES = (
    "node-*/status.json",
    "node-*/log.append",
    "node-*/claim.append",
    "node-*/artifacts.tar.gz",
    "node-*/ready",
    "node-*/done",
    "checkpoint/*",
)
_DESCRIPTION_RE = re.compile(rf"^gpucloud run ({RUN_ID_RE.pattern}): its node channel access$")
_SCOPE_RE = re.compile(
    r"^/subscriptions/([^/]+)/resourceGroups/gpucloud-storage-([a-z0-9]+)/providers/Microsoft\.Storage"
    rf"/storageAccounts/([a-z0-9]+)/blobServices/default/containers/{CONTAINER}$",
    re.I,
)


def container_scope(subscription_id: str, region: str) -> str:
    account = storage_account_name(subscription_id, region)
    return (
        f"/subscriptions/{subscription_id}/resourceGroups/{storage_group_name(region)}/providers/Microsoft.Storage"
        f"/storageAccounts/{account}/blobServices/default/containers/{CONTAINER}"
    )


def description(run_id: str) -> str:
    return f"gpucloud run {run_id}: its node channel access"


def node_condition(run_id: str) -> str:
    """Reads under runs/<run>/, writes (Put Blob, Append Block) of WRITES only, never a delete or
    a move (role assignment condition format 2.0)."""
    run = f"runs/{run_id}/"
    read = f"((!(ActionMatches{{'{BLOB}/read'}})) OR ({PATH} StringStartsWith '{run}'))"
    writes = " AND ".join(f"!(ActionMatches{{'{BLOB}/{a}'}})" for a in ("write", "add/action"))
    targets = " OR ".join(f"{PATH} StringLike '{run}{w}'" for w in WRITES)
    never = f"(!(ActionMatches{{'{BLOB}/delete'}}) AND !(ActionMatches{{'{BLOB}/move/action'}}))"
    return f"{read} AND (({writes}) OR ({targets})) AND {never}"


def channel_body(subscription_id: str, run_id: str, principal: str) -> dict[str, Any]:
    return assignment_body(
        subscription_id,
        node_role_id(subscription_id),
        principal,
        description=description(run_id),
        condition=node_condition(run_id),
        conditionVersion="2.0",
    )


def grant_channel_access(
    arm: Arm, journal: Journal, run_id: str, region: str, vm: Any, *, pause: Callable[[float], None] = time.sleep
) -> str | None:
    """The VM's identity may reach its run's blobs (journalled, then PUT; retried while the new
    identity replicates). Refused (a runner role assigned with an older condition) or the node role
    missing (setup not run): the node keeps its SAS URLs, and the answer is why and the fix, for the
    caller to say once for all of the run's nodes (`sas_only_warning`); None when granted."""
    from azure.core.exceptions import HttpResponseError

    from gpucloud.providers.azure.errors import error_parts

    scope = container_scope(arm.subscription_id, region)
    name = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{vm.id}/channel-access"))  # idempotent on retry
    body = channel_body(arm.subscription_id, run_id, vm.identity.principal_id)
    try:
        put_assignment(arm, journal, Assignment(run_id, region, scope, name, KIND), body, vm.name, pause)
    except HttpResponseError as exc:
        code, message, status = error_parts(exc)
        if code == "RoleDefinitionDoesNotExist":
            return (
                "the role 'gpucloud node channel' does not exist in this subscription; an administrator "
                "runs `gpucloud setup azure` once"
            )
        if status != 403:
            raise
        return (
            f"the role assignment on the channel was refused ({code}: {message}); assign the runner role "
            "again with the condition `gpucloud setup azure --print` shows"
        )
    return None


def sas_only_warning(names: list[str], reason: str) -> str:
    """One line for every node of a run that kept its SAS URLs for the same reason."""
    who = f"{names[0]} reaches its" if len(names) == 1 else f"{', '.join(names)} reach their"
    return f"{who} channel through the CLI's SAS URLs only (7 days at most): {reason}"


def delete_assignment(arm: Arm, assignment_id: str) -> None:
    """DELETE one role assignment; one already gone counts as deleted."""
    from azure.core.exceptions import HttpResponseError
    from azure.core.rest import HttpRequest

    from gpucloud.providers.azure.errors import with_arm_error

    response = arm.resource.send_request(HttpRequest("DELETE", f"{assignment_id}?api-version={ROLE_ASSIGNMENTS_API}"))
    if response.status_code in (200, 204, 404):
        return
    try:
        response.raise_for_status()
    except HttpResponseError as exc:
        raise with_arm_error(exc, response) from None


def revoke(arm: Arm, journal: Journal, run_id: str, region: str) -> None:
    """Delete every channel assignment of the run in `region` the journal holds (teardown)."""
    scope = container_scope(arm.subscription_id, region)
    for rec in journal.resources(run_id, alive_only=True):
        if rec.cloud == arm.name and rec.kind == KIND and (rec.region or region) == region and rec.name:
            delete_assignment(arm, rec.cloud_id or Assignment(run_id, region, scope, rec.name, KIND).id)
            journal.deleted(rec.id)


def _pages(arm: Arm) -> Iterator[list[dict[str, Any]]]:
    """Role Assignments - List For Subscription, page by page (nextLink)."""
    from azure.core.rest import HttpRequest

    url: str | None = (
        f"/subscriptions/{arm.subscription_id}/providers/Microsoft.Authorization/roleAssignments"
        f"?api-version={ROLE_ASSIGNMENTS_API}"
    )
    while url:
        response = arm.resource.send_request(HttpRequest("GET", url))
        response.raise_for_status()
        doc = response.json()
        yield list(doc.get("value") or [])
        url = doc.get("nextLink") or None


def ours(arm: Arm, assignment: dict[str, Any]) -> tuple[str, str] | None:
    """(run id, region) of a gpucloud channel assignment, exactly as grant_channel_access makes
    them; None for anything else (another user's, another role, a changed condition)."""
    props = assignment.get("properties") or {}
    m = _DESCRIPTION_RE.match(str(props.get("description") or ""))
    scope = _SCOPE_RE.match(str(props.get("scope") or ""))
    if m is None or scope is None or scope[1].lower() != arm.subscription_id.lower():
        return None
    run_id, region = m[1], scope[2].lower()
    role = str(props.get("roleDefinitionId") or "").rsplit("/", 1)[-1].lower()
    if (
        role != node_role_id(arm.subscription_id)
        or props.get("condition") != node_condition(run_id)
        or scope[3].lower() != storage_account_name(arm.subscription_id, region)
    ):
        return None
    return run_id, region


def listed(arm: Arm) -> list[tuple[str, str, str]]:
    """(assignment id, run id, region) of every gpucloud channel assignment in the subscription."""
    found = []
    for page in _pages(arm):
        for assignment in page:
            which = ours(arm, assignment)
            if which is not None:
                found.append((str(assignment.get("id") or ""), *which))
    return found
