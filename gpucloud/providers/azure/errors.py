"""Azure errors and the ProvisionError kinds they map to (docs/PROVIDERS.md, "Azure errors")."""

from __future__ import annotations

import re
from typing import Any

from gpucloud.contract.provider import (
    CandidateError,
    CapacityError,
    FatalProvisionError,
    PriceError,
    ProvisionError,
    QuotaError,
    ThrottledError,
)
from gpucloud.providers.azure.access import classify_access

CAPACITY_CODES = frozenset(
    {
        "AllocationFailed",
        "ZonalAllocationFailed",
        "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest",
        "SkuNotAvailable",
    }
)
QUOTA_CODES = frozenset({"QuotaExceeded", "OperationNotAllowed"})  # OperationNotAllowed only when about quota
THROTTLE_CODES = frozenset({"TooManyRequests", "SubscriptionRequestsThrottled", "ResourceCollectionRequestsThrottled"})
# Codes about one VM size (or its spot offer) only: the next candidate, not the rest of Azure.
CANDIDATE_CODES = frozenset(
    {
        "AzureSpotIsNotSupportedForThisVMSize",
        "AzureSpotIsNotSupportedForThisSubscriptionOffer",
        "InvalidParameter",
        "VMSizeIsNotPermittedToEnableAcceleratedNetworking",
        "BadRequest",
        "InvalidTemplateDeployment",
    }
)
AUTH_CODES = frozenset(
    {
        "AuthorizationFailed",
        "AuthenticationFailed",
        "InvalidAuthenticationToken",
        "InvalidAuthenticationTokenTenant",
        "SubscriptionNotFound",
        "LinkedAuthorizationFailed",
    }
)


def error_parts(exc: Exception) -> tuple[str, str, int | None]:
    """(ARM error code, first line of its message, HTTP status) of an azure-core error."""
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
    """Turn an Azure SDK error into the ProvisionError kind that drives failover (docs/PROVIDERS.md, "Azure errors")."""
    if isinstance(exc, ProvisionError):
        return exc
    access = classify_access(exc, what=where)  # no credentials / dead endpoint: skip Azure, not a quota
    if access is not None:
        return access  # type: ignore[return-value]
    code, message, status = error_parts(exc)
    text = f"{code}: {message}" if code else message
    if code in CAPACITY_CODES:
        return CapacityError(f"no capacity for {instance_type} in {region} ({text})", code=code)
    if code in QUOTA_CODES and (code == "QuotaExceeded" or "quota" in message.lower()):
        family = quota_family(message, instance_type)
        return QuotaError(
            f"quota exceeded: {family} in {region} ({code})",
            code=code,
            quota_code=family,
            hint=f"Request more '{family}' quota for {region} in the Azure portal (Quotas > Compute).",
        )
    if "maxprice" in code.lower() or re.search(r"max(imum)? ?price", message, re.I):
        return PriceError(f"spot price above max_price_per_hour for {instance_type} in {region} ({text})", code=code)
    if status == 429 or code in THROTTLE_CODES:
        return ThrottledError(
            f"Azure kept throttling while {where} ({text or 'HTTP 429'}); backed off and gave up",
            code=code or "TooManyRequests",
        )
    if code in AUTH_CODES or status in (401, 403):
        return FatalProvisionError(
            f"Azure refused {where}: {text}",
            code=code,
            hint="The signed-in identity needs every action of the role `gpucloud iam-policy azure` "
            "prints: `gpucloud setup azure` creates that role, an administrator assigns it (docs/AZURE.md).",
        )
    if status is not None and status >= 500:
        return ThrottledError(
            f"Azure failed while {where} (HTTP {status} {text}); retried and gave up", code=code or str(status)
        )
    if code in CANDIDATE_CODES:
        return CandidateError(f"Azure refused {instance_type or where} in {region}: {text}", code=code)
    # A code not known here most likely concerns this size or region: the next candidate is tried.
    return CandidateError(f"Azure rejected {where}: {text or type(exc).__name__}", code=code)


def with_arm_error(exc: Any, response: Any) -> Any:
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
