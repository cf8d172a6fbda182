"""Azure can or cannot be used at all: the bounded pipeline settings every Azure client gets (ARM
and Blob), a DefaultAzureCredential that does not print its 15-line diagnosis through logging, and
the errors that mean "skip Azure" (no credentials, no subscription, an endpoint that does not
answer) as CredentialsError / EndpointError (docs/PROVIDERS.md, "Azure calls and retries").

azure-core's defaults retry 10 times and wait up to 300 s per connection; a dead or wrong endpoint
must fail in seconds instead (RetryPolicy's retry_* and the transport's connection_timeout /
read_timeout keyword arguments, accepted by every azure-core client).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from gpucloud.errors import CloudAccessError, CredentialsError, EndpointError

CLOUD = "azure"
ARM_ENDPOINT_ENV = "GPUCLOUD_AZURE_ARM_ENDPOINT"
DEFAULT_ARM_ENDPOINT = "https://management.azure.com"
# A SAS gpucloud signs lives 7 days at most (its own bound, as S3's URLs; also a user-delegation key's
# longest life).
SAS_MAX_S = 7 * 86400
AUTHORITY_ENV = "AZURE_AUTHORITY_HOST"  # azure-identity: the Entra ID sign-in host (https only)
CLIENT_RETRY_TOTAL = 4  # 429/5xx answers (ARM's Retry-After is honoured)
CLIENT_RETRY_CONNECT = 2  # could not connect: the endpoint is down, do not insist
CLIENT_RETRY_READ = 1  # connected, no answer within READ_TIMEOUT_S
CLIENT_RETRY_BACKOFF_MAX_S = 8
CONNECTION_TIMEOUT_S = 3
READ_TIMEOUT_S = 8
CREDENTIALS_HINT = (
    "Sign in with `az login` (or set AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET) and set "
    "AZURE_SUBSCRIPTION_ID; `gpucloud check --cloud azure` tests them."
)


def pipeline_kwargs() -> dict[str, Any]:
    """Keyword arguments for every azure-core client: short timeouts, few retries."""
    return {
        "retry_total": CLIENT_RETRY_TOTAL,
        "retry_connect": CLIENT_RETRY_CONNECT,
        "retry_read": CLIENT_RETRY_READ,
        "retry_backoff_max": CLIENT_RETRY_BACKOFF_MAX_S,
        "connection_timeout": CONNECTION_TIMEOUT_S,
        "read_timeout": READ_TIMEOUT_S,
    }


def default_credential() -> Any:
    """DefaultAzureCredential with azure.identity's WARNING lines silenced (on failure it logs its
    whole chain once per attempt; the exception carries what we show, one line) and the same
    bounded waits for the token endpoints (managed identity, Entra ID) as for ARM."""
    from azure.identity import DefaultAzureCredential

    bad = authority_error()
    if bad is not None:
        raise bad
    logging.getLogger("azure.identity").setLevel(logging.ERROR)
    return DefaultAzureCredential(
        connection_timeout=CONNECTION_TIMEOUT_S, retry_connect=1, retry_read=1, retry_backoff_max=2
    )


def authority_error() -> CredentialsError | None:
    """AZURE_AUTHORITY_HOST set to something azure-identity refuses (it must be an https:// URL):
    a configuration mistake named with its fix, found before any credential is made."""
    from urllib.parse import urlparse

    value = os.environ.get(AUTHORITY_ENV, "").strip()
    scheme = urlparse(value).scheme if value else ""
    if not scheme or scheme == "https":  # azure-identity puts https:// before a bare host itself
        return None
    return CredentialsError(
        f"Azure: {AUTHORITY_ENV} is {value!r}, but the Entra ID sign-in host must be an https:// URL "
        "or a bare host (azure-identity refuses any other scheme).",
        cloud=CLOUD,
        hint=f"Unset {AUTHORITY_ENV} for the public cloud, or set it to the https:// host of your cloud, e.g. "
        "https://login.microsoftonline.com (Azure Government: https://login.microsoftonline.us).",
    )


# The sources gpucloud documents (`az login`, AZURE_* variables, managed identity): a failure of one
# of these is the cause; the rest of DefaultAzureCredential's chain (VS Code, PowerShell, azd, the
# broker) only says that it is not installed, which is never why Azure is unusable here.
SOURCES_THAT_MATTER = (
    "EnvironmentCredential",
    "WorkloadIdentityCredential",
    "ManagedIdentityCredential",
    "AzureCliCredential",
)
NOT_SET_UP = ("unavailable", "not found", "not installed", "could not be found", "az login", "no accounts")
NO_CREDENTIALS = "no Azure credentials found: az login / AZURE_* variables / managed identity"


def credential_summary(text: str) -> str:
    """The one line that matters of a DefaultAzureCredential failure: the first documented source
    that was set up and failed (an identity endpoint that does not answer, a rejected secret), else
    that none is set up (instead of the chain's last link, e.g. a VS Code broker package)."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return NO_CREDENTIALS
    chain = [(m[1], line) for line in lines if (m := re.match(r"(\w+Credential):", line))]
    if not chain:
        return lines[0]
    for name, line in chain:
        if name in SOURCES_THAT_MATTER and not any(word in line.lower() for word in NOT_SET_UP):
            return line
    return NO_CREDENTIALS


def first_line_of(exc: BaseException) -> str:
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


# The ARM endpoint of each Azure cloud, by its Entra ID sign-in host (azure-identity's
# AzureAuthorityHosts) and by the Azure CLI's cloud name (`az cloud list`: endpoints.resourceManager).
ARM_BY_AUTHORITY = {
    "login.microsoftonline.com": DEFAULT_ARM_ENDPOINT,
    "login.microsoftonline.us": "https://management.usgovcloudapi.net",
    "login.chinacloudapi.cn": "https://management.chinacloudapi.cn",
}
ARM_BY_CLI_CLOUD = {
    "azurecloud": DEFAULT_ARM_ENDPOINT,
    "azureusgovernment": "https://management.usgovcloudapi.net",
    "azurechinacloud": "https://management.chinacloudapi.cn",
}


def arm_endpoint() -> str:
    """The ARM endpoint of the cloud the CLI is configured for: GPUCLOUD_AZURE_ARM_ENDPOINT, else
    the cloud of AZURE_AUTHORITY_HOST, else the Azure CLI's current cloud (`az cloud set`), else
    the public cloud. The nodes' self-delete calls the same endpoint (Capabilities.node_endpoints)."""
    from urllib.parse import urlparse

    override = os.environ.get(ARM_ENDPOINT_ENV)
    if override:
        return override
    authority = os.environ.get(AUTHORITY_ENV, "").strip()
    if authority:
        host = (urlparse(authority).hostname or authority.split("/")[0]).lower()
        if host in ARM_BY_AUTHORITY:
            return ARM_BY_AUTHORITY[host]
    return ARM_BY_CLI_CLOUD.get(cli_cloud().lower(), DEFAULT_ARM_ENDPOINT)


def cli_cloud() -> str:
    """The Azure CLI's current cloud name (`[cloud] name` in $AZURE_CONFIG_DIR/config, ~/.azure by
    default), or "" when none is set or the file cannot be read."""
    import configparser

    folder = os.environ.get("AZURE_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".azure")
    parser = configparser.ConfigParser()
    try:
        parser.read(os.path.join(folder, "config"), encoding="utf-8")
    except (configparser.Error, OSError, UnicodeDecodeError):
        return ""
    return parser.get("cloud", "name", fallback="").strip()


def endpoint_of(exc: BaseException) -> str:
    """The host the SDK could not reach (named in the transport's message), else the ARM endpoint."""
    m = re.search(r"host='([^']+)', port=(\d+)", str(exc))
    return f"{m[1]}:{m[2]}" if m else arm_endpoint()


def no_subscription() -> CredentialsError:
    return CredentialsError(
        "Azure: AZURE_SUBSCRIPTION_ID is not set.",
        cloud=CLOUD,
        hint="Set it to the subscription to run in (`az account show --query id -o tsv`).",
    )


def classify_access(exc: BaseException, *, what: str = "") -> CloudAccessError | None:
    """CredentialsError / EndpointError for an Azure SDK error that makes Azure unusable; None else."""
    from azure.core.exceptions import ClientAuthenticationError, ServiceRequestError

    during = f" while {what}" if what else ""
    if isinstance(exc, CloudAccessError):
        return exc
    if isinstance(exc, ClientAuthenticationError) and not getattr(exc, "status_code", None):
        summary = credential_summary(str(exc))
        if "connection" in summary.lower():
            return EndpointError(
                f"Azure: the credential endpoint did not answer{during} ({summary}).",
                cloud=CLOUD,
                hint="Check IDENTITY_ENDPOINT / MSI_ENDPOINT and the network, or sign in with `az login`.",
            )
        if summary == NO_CREDENTIALS:
            return CredentialsError(f"{NO_CREDENTIALS}{during}.", cloud=CLOUD, hint=CREDENTIALS_HINT)
        return CredentialsError(
            f"Azure: no usable credentials{during} ({summary}).", cloud=CLOUD, hint=CREDENTIALS_HINT
        )
    if isinstance(exc, ValueError) and "authority" in str(exc):  # azure-identity's check of the sign-in host
        return authority_error() or CredentialsError(
            f"Azure: {first_line_of(exc)}{during}.", cloud=CLOUD, hint=f"Check {AUTHORITY_ENV}."
        )
    if isinstance(exc, ServiceRequestError):
        override = os.environ.get(ARM_ENDPOINT_ENV)
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        return EndpointError(
            f"Azure: could not reach {endpoint_of(exc)}{during} ({first}).",
            cloud=CLOUD,
            hint=(
                f"{ARM_ENDPOINT_ENV} is set to {override}: unset it or start the service there."
                if override
                else "Check the network (proxy, firewall, VPN)."
            ),
        )
    return None
