"""`gpucloud check` for Azure: a token from DefaultAzureCredential, the subscription and its tenant,
the enabled locations (ARM subscriptions/locations), each problem with its fix. Plain HTTPS GETs
with the same bounded timeouts as the management clients (access.py)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from gpucloud.providers.azure.access import (
    ARM_ENDPOINT_ENV,
    CLOUD,
    CREDENTIALS_HINT,
    READ_TIMEOUT_S,
    arm_endpoint,
    classify_access,
    default_credential,
)
from gpucloud.providers.base import CloudCheck

ARM_API_VERSION = "2022-12-01"


def check() -> CloudCheck:
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


def _arm_get(url: str, token: str) -> dict[str, Any]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=READ_TIMEOUT_S) as resp:  # noqa: S310 - the ARM endpoint
        return dict(json.loads(resp.read().decode() or "{}"))
