"""Container images in Azure Container Registry (docs/CONTAINERS.md, "Private registries"): the CLI
exchanges the caller's Entra ID token for an ACR refresh token (ACR's documented `/oauth2/exchange`,
as `az acr login --expose-token` does) and the machine logs in with it (user name
00000000-0000-0000-0000-000000000000). The token carries the caller's own rights on the registry
(the AcrPull role is enough) and lives about three hours; it rides sealed to the node's key like a
secret, so the machine needs no managed identity and no role assignment.

Endpoint: `https://<registry>`; GPUCLOUD_AZURE_ACR_ENDPOINT replaces the scheme and host of the
exchange call (a registry reachable another way, or a test double), never the registry's name.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request

from gpucloud.errors import UserError

_HOST = re.compile(r"^[a-z0-9]{5,50}\.azurecr\.(?:io|cn|us)$")
ENDPOINT_ENV = "GPUCLOUD_AZURE_ACR_ENDPOINT"
TOKEN_USERNAME = "00000000-0000-0000-0000-000000000000"  # what ACR expects with a refresh token
EXCHANGE_TIMEOUT_S = 10.0
DEFAULT_LIFETIME_S = 3 * 3600.0  # when the refresh token's own expiry cannot be read


def is_acr(registry: str) -> bool:
    return bool(_HOST.match(registry.lower()))


def _claims(token: str) -> dict[str, object]:
    """A JWT's payload (unverified: only to read `tid` and `exp`); {} when it is not a JWT."""
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    try:
        doc = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, json.JSONDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def pull_token(registry: str, where: str) -> tuple[str, str, float]:
    """(username, refresh token, expires-at epoch) for `<engine> login registry`; UserError naming
    the registry when the caller has no Azure credentials or ACR refuses them."""
    from gpucloud.providers.azure.access import arm_endpoint, default_credential

    try:
        aad = default_credential().get_token(f"{arm_endpoint()}/.default").token
    except Exception as exc:  # noqa: BLE001 - azure-identity raises several types; each means "no token"
        raise UserError(
            f"{where}: no Azure credentials to log in to {registry} ({str(exc).splitlines()[0][:200]}).",
            hint="Sign in with `az login` (or set a service principal), or give `container.login` with a token.",
        ) from None
    body = {"grant_type": "access_token", "service": registry, "access_token": aad}
    tenant = _claims(aad).get("tid")
    if isinstance(tenant, str):
        body["tenant"] = tenant
    base = os.environ.get(ENDPOINT_ENV, "").rstrip("/") or f"https://{registry}"
    request = urllib.request.Request(
        f"{base}/oauth2/exchange",
        data=urllib.parse.urlencode(body).encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=EXCHANGE_TIMEOUT_S) as resp:
            doc = json.loads(resp.read(1024 * 1024))
    except urllib.error.HTTPError as exc:
        raise UserError(
            f"{where}: {registry} refused the exchange of your Azure token (HTTP {exc.code}).",
            hint="Your identity needs the AcrPull role on the registry (az role assignment create "
            "--role AcrPull --assignee <you> --scope <registry id>).",
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise UserError(f"{where}: cannot reach {registry} to get a pull token ({exc}).") from None
    refresh = doc.get("refresh_token") if isinstance(doc, dict) else None
    if not isinstance(refresh, str) or not refresh:
        raise UserError(f"{where}: {registry} answered the token exchange without a refresh_token.")
    exp = _claims(refresh).get("exp")
    expires = float(exp) if isinstance(exp, (int, float)) else time.time() + DEFAULT_LIFETIME_S
    return TOKEN_USERNAME, refresh, expires
