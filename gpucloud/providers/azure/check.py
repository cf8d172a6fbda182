"""`gpucloud check` for Azure: a token from DefaultAzureCredential, the subscription and its tenant,
the enabled locations (ARM subscriptions/locations), each problem with its fix. Plain HTTPS GETs
with the same bounded timeouts as the management clients (access.py). And `identity`, the one call
`run` makes before its launch prompt: the subscription, read through the provider's own ARM client
(its pipeline, retries and timeouts)."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

from gpucloud.contract.provider import CloudCheck
from gpucloud.errors import CredentialsError
from gpucloud.providers.azure.access import (
    ARM_ENDPOINT_ENV,
    CLOUD,
    CREDENTIALS_HINT,
    READ_TIMEOUT_S,
    arm_endpoint,
    classify_access,
    default_credential,
    no_subscription,
)

ARM_API_VERSION = "2022-12-01"
# The quotas are read until this many seconds into the check (run/check.py gives it 10 s in all):
# on a slow machine the rest are "unknown", rather than the whole check lost.
QUOTAS_BY_S = 7.0
# Subscription states in which nothing can be created (ARM: Enabled, Warned, PastDue, Disabled, Deleted).
UNUSABLE_STATES = frozenset({"Disabled", "Deleted"})
# ARM's answers to the subscription GET that mean these credentials cannot use it: a token it
# refuses (401), no role on the subscription (403), a subscription they cannot see (404).
REFUSED_STATUSES = frozenset({401, 403, 404})


def check() -> CloudCheck:
    started = time.monotonic()
    result = CloudCheck(CLOUD)
    sub = os.environ.get("AZURE_SUBSCRIPTION_ID", "")
    arm = arm_endpoint().rstrip("/")
    try:
        token = default_credential().get_token(f"{arm}/.default").token
        result.credentials = True
        if not sub:
            result.problem(
                "AZURE_SUBSCRIPTION_ID is not set",
                "Set it to the subscription to run in (`az account show --query id -o tsv`).",
            )
            return result
        info = _arm_get(f"{arm}/subscriptions/{sub}?api-version={ARM_API_VERSION}", token)
        result.identity = {
            "subscription": sub,
            "tenant": str(info.get("tenantId", "")),
            "name": str(info.get("displayName", "")),
            "state": str(info.get("state", "")),
        }
        locations = _arm_get(f"{arm}/subscriptions/{sub}/locations?api-version={ARM_API_VERSION}", token)
        result.regions = sorted(str(loc.get("name")) for loc in locations.get("value", []))
        result.usable = True
        _setup_piece(arm, sub, token, result)
        _quotas(result, budget_s=max(1.0, QUOTAS_BY_S - (time.monotonic() - started)))
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")[:300]
        result.problem(
            f"Azure Resource Manager answered HTTP {exc.code} for subscription {sub}: {body}",
            "Check AZURE_SUBSCRIPTION_ID and that the signed-in identity has a role on it.",
        )
    except OSError as exc:  # URLError, timeouts
        result.problem(
            f"Azure: could not reach {arm} ({getattr(exc, 'reason', exc)})",
            f"Check the network, or {ARM_ENDPOINT_ENV} if it is set.",
        )
    except Exception as exc:  # noqa: BLE001
        access = classify_access(exc)
        result.problem(
            access.message if access else f"Azure: {type(exc).__name__}: {exc}",
            access.hint if access else CREDENTIALS_HINT,
        )
    return result


def identity() -> str:
    """The subscription in AZURE_SUBSCRIPTION_ID as ARM shows it to these credentials: a token
    that is refused, a subscription that is unknown to them or disabled, and an endpoint that does
    not answer are each a CredentialsError/EndpointError with the fix, found before the launch prompt.
    Throttling or an ARM-side failure says nothing about the credentials: the cloud is kept."""
    from azure.core.rest import HttpRequest

    from gpucloud.providers.azure.provider import AzureProvider

    sub = os.environ.get("AZURE_SUBSCRIPTION_ID", "")
    if not sub:
        raise no_subscription()
    try:
        request = HttpRequest("GET", f"/subscriptions/{sub}", params={"api-version": ARM_API_VERSION})
        response = AzureProvider(subscription_id=sub).resource.send_request(request)
    except Exception as exc:  # noqa: BLE001 - classified below; only access errors drop the cloud
        access = classify_access(exc, what="reading the subscription")
        if access is not None:
            raise access from None
        return f"subscription {sub} not confirmed ({type(exc).__name__})"
    try:
        body = dict(response.json())
    except (ValueError, TypeError):  # not JSON (a proxy's page): the status says enough
        body = {}
    if response.status_code in REFUSED_STATUSES:
        raise _refused(sub, response.status_code, body)
    if response.status_code != 200:  # throttled or failing after the pipeline's retries: not about the credentials
        return f"subscription {sub} not confirmed (HTTP {response.status_code})"
    state = str(body.get("state", ""))
    if state in UNUSABLE_STATES:
        raise CredentialsError(
            f"Azure: subscription {sub} is {state}: nothing can be created in it.",
            cloud=CLOUD,
            hint="Use an enabled subscription (`az account list -o table`) in AZURE_SUBSCRIPTION_ID.",
        )
    return f"subscription {body.get('displayName') or sub} ({sub}), tenant {body.get('tenantId', '?')}"


def _refused(sub: str, status: int, body: dict[str, Any]) -> CredentialsError:
    """ARM's answer `{"error": {"code", "message"}}` to the subscription GET, with the fix it needs."""
    found = body.get("error")
    error: dict[str, Any] = found if isinstance(found, dict) else {}
    code, message = str(error.get("code", "")), str(error.get("message", "")).strip().split("\n")[0]
    said = f"HTTP {status} {code}: {message}".strip().rstrip(":")
    if status == 404 or code == "SubscriptionNotFound":
        hint = "Check AZURE_SUBSCRIPTION_ID (`az account list -o table` lists the subscriptions you can use)."
    elif status == 403:
        hint = "Give the signed-in identity a role on the subscription (Contributor), or use another one."
    else:
        hint = CREDENTIALS_HINT
    return CredentialsError(f"Azure refused the credentials for subscription {sub} ({said}).", cloud=CLOUD, hint=hint)


def _arm_get(url: str, token: str) -> dict[str, Any]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=READ_TIMEOUT_S) as resp:  # noqa: S310 - the ARM endpoint
        return dict(json.loads(resp.read().decode() or "{}"))


def _setup_piece(arm: str, sub: str, token: str, result: CloudCheck) -> None:
    """The custom roles `gpucloud setup azure` creates (the runner's, the node's): each present,
    missing (a problem with its fix), or not readable (noted)."""
    from gpucloud.providers.azure.rbac import NODE_ROLE_NAME, ROLE_NAME
    from gpucloud.providers.azure.setup import ROLE_DEFINITIONS_API, node_role_path, role_path

    for name, path in ((ROLE_NAME, role_path(sub)), (NODE_ROLE_NAME, node_role_path(sub))):
        piece = f"role definition '{name}'"
        try:
            _arm_get(f"{arm}{path}?api-version={ROLE_DEFINITIONS_API}", token)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                result.setup.append({"piece": piece, "state": "unknown", "detail": f"not readable (HTTP {exc.code})"})
                continue
            result.setup.append({"piece": piece, "state": "missing", "detail": ""})
            result.problem(
                f"the {piece} is missing",
                "An administrator runs `gpucloud setup azure` (or `gpucloud setup azure --print` for the commands).",
            )
            continue
        result.setup.append({"piece": piece, "state": "present", "detail": ""})


def _quotas(result: CloudCheck, budget_s: float) -> None:
    """The GPU families' vCPU quotas in every enabled location, read at once (quota.py); a
    family that is 0 in every location that answered is one problem, with the command to raise
    it. A lookup that fails is "unknown" with its note, never a problem of the check."""
    from gpucloud.providers.azure.quota import raise_command, region_quotas

    result.quotas.extend(region_quotas(result.regions, budget_s))
    zero: dict[str, list[str]] = {}
    some: set[str] = set()
    for q in result.quotas:
        if q["vcpus"] is None:
            continue
        if q["vcpus"] == 0:
            zero.setdefault(str(q["code"]), []).append(str(q["region"]))
        else:
            some.add(str(q["code"]))
    none_anywhere = [code for code in zero if code not in some]
    if none_anywhere:
        where = result.regions[0] if result.regions else "<location>"
        result.problem(
            f"GPU quota is 0 vCPUs in every location read for {', '.join(none_anywhere)}: no such VM can start",
            "Ask for quota in the locations you will use: "
            + raise_command(none_anywhere[0], where, result.identity.get("subscription", "<subscription-id>")),
        )
