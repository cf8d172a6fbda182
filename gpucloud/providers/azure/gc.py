"""`gpucloud gc` on Azure: every resource group (any region: groups are subscription-wide) whose
expiry tag passed, found by ARM's tag-filtered listing, and (unless dry-run) deleted; then every
node channel role assignment (node_access.py) whose run has no resource group left. Assignments are
listed before groups: one made after the listing cannot be taken for an ended run's.

Reported per call, so that "am I clean?" has an answer even when one call fails: each page of the
listing and each group's DELETE is a call of its own. A call that fails (an unsupported or failing
endpoint, a refused action) is named with its RBAC action, scope and reason, and what the other
calls found still counts: the sweep ends as GcIncomplete (exit 75, Azure checked "in part"). Only
an error that makes Azure unusable (no credentials, an endpoint that does not answer) stops it
whole, as before (exit 78).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpucloud.contract.provider import TAG_EXPIRES, TAG_RUN, expiry_tag
from gpucloud.contract.tags import GcIncomplete, tagged_expiry
from gpucloud.errors import EndpointError
from gpucloud.providers.azure.access import ARM_ENDPOINT_ENV, CLOUD, classify_access
from gpucloud.providers.azure.arm import Arm
from gpucloud.providers.azure.errors import error_parts
from gpucloud.ui.untrusted import shown

LIST_ACTION = "Microsoft.Resources/subscriptions/resourceGroups/read"
DELETE_ACTION = "Microsoft.Resources/subscriptions/resourceGroups/delete"
ASSIGNMENTS_ACTION = "Microsoft.Authorization/roleAssignments/read"
ASSIGNMENT_DELETE_ACTION = "Microsoft.Authorization/roleAssignments/delete"


def _why(exc: Exception) -> str:
    code, message, status = error_parts(exc)
    said = f"{code}: {message}" if code else (message or type(exc).__name__)
    return shown((f"HTTP {status} " if status else "") + said, limit=200)


def _silent(exc: Exception, page: int, what: str = "listing resource groups") -> EndpointError | None:
    """The first call's request went out and no answer came (a read timeout): the endpoint does not
    answer, so Azure is unusable (78), not checked "in part"."""
    from azure.core.exceptions import ServiceResponseError

    if page != 1 or not isinstance(exc, ServiceResponseError):
        return None
    return EndpointError(
        f"Azure: the resource manager did not answer while {what} ({_why(exc)}).",
        cloud=CLOUD,
        hint=f"Check the network (proxy, firewall, VPN), and {ARM_ENDPOINT_ENV} if it is set.",
    )


def _expired(provider: Arm, now: datetime, lines: list[str], failures: list[str], live: set[str]) -> list[Any]:
    """The expired groups of every page that could be read; a page that could not is one failure.
    `live` gets the run of every other group (its nodes may still use their channel access)."""
    scope = f"/subscriptions/{provider.subscription_id}"
    found: list[Any] = []
    pages = provider.resource.resource_groups.list(filter=f"tagName eq '{TAG_EXPIRES}'").by_page()
    page = 0
    while True:
        page += 1
        try:
            groups = list(next(pages))
        except StopIteration:
            return found
        except Exception as exc:  # noqa: BLE001 - one call: named below, the others' finds still count
            access = classify_access(exc, what="listing resource groups") or _silent(exc, page)
            if access is not None:
                raise access from None
            failures.append(
                f"azure: listing resource groups (page {page}; {LIST_ACTION} over {scope}) could not be "
                f"checked ({_why(exc)}): expired run groups there, if any, were not seen"
            )
            return found
        for group in groups:
            tags = group.tags or {}
            expires, why = tagged_expiry(tags)
            if why:  # not gpucloud's tags as it writes them: named, never deleted
                lines.append(f"azure: resource group {shown(group.name, limit=100)} left alone: {why}")
            if expires is not None and expires <= now and not why:
                found.append(group)
            else:  # a group that stays: its run's nodes may still use their channel access
                live.add(str(tags.get(TAG_RUN, "")))


def sweep(provider: Arm, now: datetime, *, dry_run: bool) -> list[str]:
    """Find (and unless dry_run delete) the expired run groups; raise GcIncomplete naming each
    call that failed, with the lines of those that did not."""
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    lines: list[str] = []
    failures: list[str] = []
    access = _access_listed(provider, failures)
    live: set[str] = set()
    pollers = []
    before = len(failures)
    expired = _expired(provider, now, lines, failures, live)
    listed_whole = len(failures) == before
    for group in expired:
        tags = group.tags or {}
        expires, _ = tagged_expiry(tags)
        line = (
            f"azure/{group.location}/resource-group/{group.name} "
            f"(run {tags.get(TAG_RUN, '?')}, expired {expiry_tag(expires) if expires else '?'})"
        )
        if dry_run:
            lines.append(f"would delete {line}")
            continue
        state = getattr(group.properties, "provisioning_state", None) if group.properties else None
        try:
            poller = provider.resource.resource_groups.begin_delete(
                group.name, force_deletion_types="Microsoft.Compute/virtualMachines"
            )
        except Exception as exc:  # noqa: BLE001 - one call (below); a gone group is fine
            if not _delete_failed(provider, exc, line, group.name, lines, failures):
                live.add(str(tags.get(TAG_RUN, "")))
            continue
        line += " (was already being deleted)" if state == "Deleting" else ""
        pollers.append((line, group.name, poller, str(tags.get(TAG_RUN, ""))))
    for line, name, poller, run_id in pollers:
        try:
            poller.result()
            lines.append(f"deleted {line}")
        except Exception as exc:  # noqa: BLE001
            if not _delete_failed(provider, exc, line, name, lines, failures):
                live.add(run_id)
    if access is not None and listed_whole:  # every group seen: `live` is whole
        _sweep_access(provider, access, live, lines, failures, dry_run=dry_run)
    elif access:  # the sweep is incomplete already; a run not listed may still be alive
        lines.append("azure: node channel role assignments left for the next gc: resource groups were not all listed")
    if failures:
        raise GcIncomplete(lines, failures)
    return lines


def _delete_failed(provider: Arm, exc: Exception, line: str, name: str, lines: list[str], failures: list[str]) -> bool:
    """A group's DELETE that failed: a group already gone is deleted (True); anything else is one failure."""
    from azure.core.exceptions import ResourceNotFoundError

    if isinstance(exc, ResourceNotFoundError):
        lines.append(f"deleted {line}")
        return True
    access = classify_access(exc, what=f"deleting resource group {name}")
    if access is not None:
        raise access from None
    scope = f"/subscriptions/{provider.subscription_id}/resourceGroups/{name}"
    failures.append(f"azure: deleting {line} ({DELETE_ACTION} over {scope}) failed ({_why(exc)}): it is still there")
    return False


def _access_listed(provider: Arm, failures: list[str]) -> list[tuple[str, str, str]] | None:
    """Every gpucloud channel assignment (node_access.listed), or None and one failure."""
    from gpucloud.providers.azure.node_access import listed

    try:
        return listed(provider)
    except Exception as exc:  # noqa: BLE001 - one call: named, the groups are still swept
        access = classify_access(exc, what="listing role assignments") or _silent(exc, 1, "listing role assignments")
        if access is not None:
            raise access from None
        failures.append(
            f"azure: listing role assignments ({ASSIGNMENTS_ACTION} over /subscriptions/{provider.subscription_id}) "
            f"could not be checked ({_why(exc)}): node channel access of ended runs, if any, was not seen"
        )
        return None


def _sweep_access(
    provider: Arm,
    access: list[tuple[str, str, str]],
    live: set[str],
    lines: list[str],
    failures: list[str],
    *,
    dry_run: bool,
) -> None:
    """Delete the channel assignments of runs with no resource group left."""
    from gpucloud.providers.azure.node_access import delete_assignment

    for assignment_id, run_id, region in access:
        if run_id in live:
            continue
        line = f"azure/{region}/role-assignment/{assignment_id.rsplit('/', 1)[-1]} (run {run_id}, node channel access)"
        if dry_run:
            lines.append(f"would delete {line}")
            continue
        try:
            delete_assignment(provider, assignment_id)
        except Exception as exc:  # noqa: BLE001 - one call: named, the others still count
            failures.append(
                f"azure: deleting {line} ({ASSIGNMENT_DELETE_ACTION} over {assignment_id}) failed ({_why(exc)})"
            )
            continue
        lines.append(f"deleted {line}")
