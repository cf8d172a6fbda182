"""AWS error codes and the ProvisionError kinds they map to (docs/PROVIDERS.md, "AWS errors").

Codes are matched with "contains": CloudTrail and some SDK paths prefix them with "Client." or
"Server.". The kind drives failover: capacity -> next zone or candidate, quota -> skip the region,
throttle/server -> back off, then next candidate, candidate -> next candidate, fatal -> skip the
cloud. Only codes that say the whole account is refused are fatal; a code this module does not know
concerns the one candidate (its image, type or zone), so the cloud's other candidates are still tried.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpucloud.contract.provider import (
    CandidateError,
    CapacityError,
    FatalProvisionError,
    PriceError,
    ProvisionError,
    QuotaError,
    ThrottledError,
)
from gpucloud.errors import GpucloudError

CAPACITY_CODES = (
    "InsufficientInstanceCapacity",
    "InsufficientHostCapacity",
    "InsufficientCapacity",
    "UnfulfillableCapacity",
    "InsufficientFreeAddressesInSubnet",
)
QUOTA_CODES = ("VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded", "AddressLimitExceeded")
# The Elastic IP quota an EFA run's nodes count against (efa.py): Service Quotas "EC2-VPC Elastic IPs".
EIP_QUOTA = ("L-0263D0A3", "EC2-VPC Elastic IPs")
PRICE_CODES = ("SpotMaxPriceTooLow",)
THROTTLE_CODES = (
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "TooManyRequestsException",
    "SlowDown",
    "RequestThrottled",
)
# AWS-side failures worth retrying like throttling (5xx): a bad minute is not a bad region.
SERVER_CODES = ("InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable")
# The account itself is refused (every candidate of the cloud would get the same answer).
FATAL_CODES = (
    "UnauthorizedOperation",
    "AccessDenied",
    "OptInRequired",
    "PendingVerification",
    "Blocked",
    "SignatureDoesNotMatch",
    "InvalidClientTokenId",
)

# Service Quotas codes of the vCPU quotas RunInstances trips over, by instance family
# (docs/PROVIDERS.md, "AWS quotas").
_QUOTA_BY_FAMILY = {
    ("p", False): ("L-417A185B", "Running On-Demand P instances"),
    ("g", False): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("vt", False): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("p", True): ("L-7212CCBC", "All P Spot Instance Requests"),
    ("g", True): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("vt", True): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
}
_STANDARD_QUOTA = {
    False: ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
    True: ("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"),
}


class AwsTeardownError(GpucloudError):
    """Some of a run's resources could not be deleted now; they keep their tags for `down`/`gc`."""

    exit_code = 70


def error_code(exc: BaseException) -> str:
    """The AWS error code of a botocore ClientError ("" for anything else)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", "") or "")
    return ""


def error_message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Message", "") or "")
    return str(exc)


def http_status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return status if isinstance(status, int) else None
    return None


def describe(exc: BaseException) -> str:
    """`Code: message` for a line of a report."""
    return f"{error_code(exc) or type(exc).__name__}: {error_message(exc)}"


def _has(code: str, names: Iterable[str]) -> bool:
    return any(name in code for name in names)


def error_kind(code: str) -> str:
    """capacity | quota | price | throttle | server | fatal | candidate, by "contains" on the code."""
    if _has(code, THROTTLE_CODES):
        return "throttle"
    if _has(code, QUOTA_CODES):
        return "quota"
    if _has(code, PRICE_CODES):
        return "price"
    # "Unsupported" (type not offered in that zone) is matched whole: "UnsupportedOperation" is fatal.
    if _has(code, CAPACITY_CODES) or code.rsplit(".", 1)[-1] == "Unsupported":
        return "capacity"
    if _has(code, SERVER_CODES):
        return "server"
    if _has(code, FATAL_CODES):
        return "fatal"
    return "candidate"


def is_transient(exc: BaseException) -> bool:
    """Worth the same call again after a pause: throttling, or AWS failing on its side (5xx)."""
    kind = error_kind(error_code(exc))
    status = http_status(exc)
    # A 5xx with a capacity code (Server.InsufficientInstanceCapacity) is an answer, not a failure.
    return kind in ("throttle", "server") or (kind in ("candidate", "fatal") and status is not None and status >= 500)


def gpu_quotas() -> dict[str, str]:
    """Code -> name of every GPU vCPU quota RunInstances can trip over (what `gpucloud check` reads)."""
    return dict(_QUOTA_BY_FAMILY.values())


def quota_for(instance_type: str, spot: bool) -> tuple[str, str]:
    """(quota code, quota name) of the vCPU quota that limits launching this instance type."""
    family = re.match(r"[a-z]+", instance_type.lower())
    letters = family.group(0) if family else ""
    for key in (letters, letters[:2], letters[:1]):
        hit = _QUOTA_BY_FAMILY.get((key, spot))
        if hit:
            return hit
    return _STANDARD_QUOTA[spot]


def classify(
    exc: BaseException, *, region: str, instance_type: str, spot: bool, what: str, tries: int = 1
) -> ProvisionError:
    """The ProvisionError that tells the lifecycle what to do after this AWS error."""
    code = error_code(exc) or type(exc).__name__
    msg = error_message(exc)
    where = f"{region}/{instance_type}{' (spot)' if spot else ''}"
    kind = error_kind(code) if error_code(exc) else "server"
    if kind == "capacity":
        return CapacityError(f"{where}: no capacity ({code}) while {what}: {msg}", code=code)
    if kind == "quota":
        eip = "AddressLimitExceeded" in code
        qcode, qname = EIP_QUOTA if eip else quota_for(instance_type, spot)
        return QuotaError(
            f"{where}: quota reached ({code}: {msg}); the limiting quota is '{qname}' ({qcode}).",
            code=code,
            quota_code=qcode,
            hint=f"Request more in Service Quotas: aws service-quotas request-service-quota-increase "
            f"--service-code ec2 --quota-code {qcode} --region {region} "
            f"--desired-value <{'addresses: one per EFA node' if eip else 'vCPUs'}>",
        )
    if kind == "price":
        return PriceError(
            f"{where}: the spot price is above the max price ({code}: {msg})",
            code=code,
            hint="Raise resources.max_price_per_hour or use spot: auto.",
        )
    if kind in ("throttle", "server"):
        return ThrottledError(
            f"{where}: AWS kept answering {code} while {what} (gave up after {tries} tries): {msg}", code=code
        )
    if kind == "fatal":
        return FatalProvisionError(f"{where}: AWS refused {what} ({code}: {msg})", code=code)
    return CandidateError(f"{where}: AWS refused {what} for this candidate ({code}: {msg})", code=code)
