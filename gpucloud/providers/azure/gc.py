"""`gpucloud gc` on Azure: every resource group (any region: groups are subscription-wide) whose
expiry tag passed, found by ARM's tag-filtered listing, and (unless dry-run) deleted.

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


def _why(exc: Exception) -> str:
    code, message, status = error_parts(exc)
    said = f"{code}: {message}" if code else (message or type(exc).__name__)
    return shown((f"HTTP {status} " if status else "") + said, limit=200)


def _silent(exc: Exception, page: int) -> EndpointError | None:
    """The first call's request went out and no answer came (a read timeout): the endpoint does not
    answer, so Azure is unusable (78), not checked "in part"."""
    from azure.core.exceptions import ServiceResponseError

    if page != 1 or not isinstance(exc, ServiceResponseError):
        return None
    return EndpointError(
        f"Azure: the resource manager did not answer while listing resource groups ({_why(exc)}).",
        cloud=CLOUD,
        hint=f"Check the network (proxy, firewall, VPN), and {ARM_ENDPOINT_ENV} if it is set.",
    )


def _expired(provider: Arm, now: datetime, lines: list[str], failures: list[str]) -> list[Any]:
    """The expired groups of every page that could be read; a page that could not is one failure."""
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
            elif expires is not None and expires <= now:
                found.append(group)


def sweep(provider: Arm, now: datetime, *, dry_run: bool) -> list[str]:
    """Find (and unless dry_run delete) the expired run groups; raise GcIncomplete naming each
    call that failed, with the lines of those that did not."""
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    lines: list[str] = []
    failures: list[str] = []
    pollers = []
    for group in _expired(provider, now, lines, failures):
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
            _delete_failed(provider, exc, line, group.name, lines, failures)
            continue
        pollers.append((line + (" (was already being deleted)" if state == "Deleting" else ""), group.name, poller))
    for line, name, poller in pollers:
        try:
            poller.result()
            lines.append(f"deleted {line}")
        except Exception as exc:  # noqa: BLE001
            _delete_failed(provider, exc, line, name, lines, failures)
    if failures:
        raise GcIncomplete(lines, failures)
    return lines


def _delete_failed(provider: Arm, exc: Exception, line: str, name: str, lines: list[str], failures: list[str]) -> None:
    """A group's DELETE that failed: a group already gone is deleted; anything else is one failure."""
    from azure.core.exceptions import ResourceNotFoundError

    if isinstance(exc, ResourceNotFoundError):
        lines.append(f"deleted {line}")
        return
    access = classify_access(exc, what=f"deleting resource group {name}")
    if access is not None:
        raise access from None
    scope = f"/subscriptions/{provider.subscription_id}/resourceGroups/{name}"
    failures.append(f"azure: deleting {line} ({DELETE_ACTION} over {scope}) failed ({_why(exc)}): it is still there")
