"""The role assignment that lets a VM delete its own resource group: the built-in Contributor role,
scoped to that group only, for the VM's system-assigned identity (why Contributor and not a custom
role: provider.py's docstring)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpucloud.providers.azure.arm import Arm
from gpucloud.providers.azure.errors import error_parts, with_arm_error

if TYPE_CHECKING:
    from gpucloud.contract.provider import Journal

# Built-in "Contributor" (the same id in every tenant and cloud).
CONTRIBUTOR_ROLE_ID = "b24988ac-6180-42a0-ab88-20f7382dd24c"
ROLE_ASSIGNMENTS_API = "2022-04-01"
# A new identity takes a while to replicate before a role can be assigned to it.
PRINCIPAL_RETRY_DELAYS = (0.5, 1, 2, 4, 8, 15, 30)


def assignment_body(subscription_id: str, role_id: str, principal: str, **props: str) -> dict[str, Any]:
    """A role assignment's body for a VM's system-assigned identity (`props`: description, condition)."""
    return {
        "properties": {
            "roleDefinitionId": f"/subscriptions/{subscription_id}/providers/Microsoft.Authorization"
            f"/roleDefinitions/{role_id}",
            "principalId": principal,
            "principalType": "ServicePrincipal",
            **props,
        }
    }


def self_delete_body(subscription_id: str, run_id: str, principal: str) -> dict[str, Any]:
    """The role assignment's body: Contributor for the VM's identity."""
    what = f"gpucloud run {run_id}: lets the VM delete its own resource group"
    return assignment_body(subscription_id, CONTRIBUTOR_ROLE_ID, principal, description=what)


def grant_self_delete(
    arm: Arm,
    journal: Journal,
    run_id: str,
    region: str,
    rg: str,
    vm: Any,
    *,
    pause: Callable[[float], None] = time.sleep,
) -> None:
    """Contributor on the VM's own resource group for its system-assigned identity. `pause` waits
    between retries while the identity replicates (a node's thread passes one that can give up)."""
    scope = f"/subscriptions/{arm.subscription_id}/resourceGroups/{rg}"
    name = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{vm.id}/self-delete"))  # idempotent on retry
    body = self_delete_body(arm.subscription_id, run_id, vm.identity.principal_id)
    put_assignment(arm, journal, Assignment(run_id, region, scope, name, "role_assignment"), body, vm.name, pause)


@dataclass(frozen=True)
class Assignment:
    """Where a role assignment goes and how the journal names it."""

    run_id: str
    region: str
    scope: str
    name: str  # a GUID, derived from the VM and purpose so that a retry PUTs the same one
    kind: str  # the journal's resource kind

    @property
    def id(self) -> str:
        return f"{self.scope}/providers/Microsoft.Authorization/roleAssignments/{self.name}"


def put_assignment(
    arm: Arm, journal: Journal, where: Assignment, body: dict[str, Any], vm_name: str, pause: Callable[[float], None]
) -> None:
    """Journal, then PUT the assignment; again while the VM's new identity has not replicated
    (PrincipalNotFound), and an assignment already there counts as made."""
    from azure.core.exceptions import HttpResponseError
    from azure.core.rest import HttpRequest

    url = f"{where.id}?api-version={ROLE_ASSIGNMENTS_API}"
    res_id = journal.intent(where.run_id, where.kind, where.name, where.region, arm.name)
    delays = list(PRINCIPAL_RETRY_DELAYS)
    while True:
        response = arm.resource.send_request(HttpRequest("PUT", url, json=body))
        if response.status_code in (200, 201):
            break
        try:
            response.raise_for_status()
        except HttpResponseError as exc:
            code, _, _ = error_parts(with_arm_error(exc, response))
            if code == "RoleAssignmentExists":
                break
            if code == "PrincipalNotFound" and delays:
                journal.event(
                    where.run_id, "retry", f"identity of {vm_name} not replicated yet; retrying the role assignment"
                )
                pause(delays.pop(0))
                continue
            journal.deleted(res_id)  # ARM answered no: nothing was created
            raise with_arm_error(exc, response) from None
    journal.created(res_id, where.id)
