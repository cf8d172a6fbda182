"""Azure errors that mean "this cloud cannot be used at all" (no credentials, no subscription, an
ARM endpoint that does not answer), the bounded pipeline settings every Azure client gets, and a
DefaultAzureCredential that does not print its 15-line diagnosis through logging.

azure-core's defaults wait up to 300 s per connection and retry 10 times; a dead or wrong endpoint
must fail in seconds instead (azure-core `RetryPolicy` retry_connect/retry_read and the transport's
connection_timeout/read_timeout keyword arguments, accepted by every management client).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from gpucloud.errors import CloudAccessError, CredentialsError, EndpointError

CLOUD = "azure"
CONNECTION_TIMEOUT_S = 5
READ_TIMEOUT_S = 60
CREDENTIALS_HINT = ("Sign in with `az login` (or set AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET) and set "
                    "AZURE_SUBSCRIPTION_ID; `gpucloud check --cloud azure` tests them.")


def pipeline_kwargs() -> dict[str, Any]:
    """Keyword arguments for azure-core clients: short connect timeout, few connect/read retries."""
    return {"connection_timeout": CONNECTION_TIMEOUT_S, "read_timeout": READ_TIMEOUT_S,
            "retry_connect": 2, "retry_read": 2, "retry_backoff_max": 10}


def default_credential() -> Any:
    """DefaultAzureCredential with azure.identity's WARNING log lines silenced: on failure it logs
    its whole chain once per attempt, and the exception already carries what we show (one line)."""
    from azure.identity import DefaultAzureCredential

    logging.getLogger("azure.identity").setLevel(logging.ERROR)
    # The same bounded waits for the token endpoints (managed identity, AAD) as for ARM.
    return DefaultAzureCredential(connection_timeout=CONNECTION_TIMEOUT_S, retry_connect=1, retry_read=1,
                                  retry_backoff_max=2)


def credential_summary(text: str) -> str:
    """The one line that matters of a DefaultAzureCredential failure: which credentials were tried
    and that none worked (instead of the chain's 15 lines of links and advice)."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return "no credential available"
    tried = [m[1] for line in lines if (m := re.match(r"(\w+Credential):", line))]
    failed = [line for line in lines if re.match(r"\w+Credential:", line) and "unavailable" not in line.lower()]
    if failed:  # a source that was configured and failed (e.g. an identity endpoint that does not answer)
        return failed[0]
    if tried:
        shown = ", ".join(tried[:3]) + (", ..." if len(tried) > 3 else "")
        return f"DefaultAzureCredential tried {len(tried)} sources ({shown}); none had credentials"
    return lines[0]


def arm_endpoint() -> str:
    return os.environ.get("GPUCLOUD_AZURE_ARM_ENDPOINT") or "https://management.azure.com"


def no_subscription() -> CredentialsError:
    return CredentialsError("Azure: AZURE_SUBSCRIPTION_ID is not set.", cloud=CLOUD,
                            hint="Set it to the subscription to run in (`az account show --query id -o tsv`).")


def classify_access(exc: BaseException, *, what: str = "") -> CloudAccessError | None:
    """CredentialsError / EndpointError for an Azure SDK error that makes Azure unusable; None else."""
    from azure.core.exceptions import ClientAuthenticationError, ServiceRequestError

    during = f" while {what}" if what else ""
    if isinstance(exc, CloudAccessError):
        return exc
    if isinstance(exc, ClientAuthenticationError) and not getattr(exc, "status_code", None):
        summary = credential_summary(str(exc))
        if "connection" in summary.lower():
            return EndpointError(f"Azure: the credential endpoint did not answer{during} ({summary}).", cloud=CLOUD,
                                 hint="Check IDENTITY_ENDPOINT / MSI_ENDPOINT and the network, or sign in with `az login`.")
        return CredentialsError(f"Azure: no usable credentials{during} ({credential_summary(str(exc))}).",
                                cloud=CLOUD, hint=CREDENTIALS_HINT)
    if isinstance(exc, ServiceRequestError):
        endpoint = arm_endpoint()
        override = os.environ.get("GPUCLOUD_AZURE_ARM_ENDPOINT")
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        return EndpointError(f"Azure: could not reach {endpoint}{during} ({first}).", cloud=CLOUD,
                             hint=(f"GPUCLOUD_AZURE_ARM_ENDPOINT is set to {override}: unset it or start the "
                                   "service there." if override else
                                   "Check the network (proxy, firewall, VPN)."))
    return None
