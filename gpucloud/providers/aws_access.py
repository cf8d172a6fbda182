"""AWS errors that mean "this cloud cannot be used at all": missing or refused credentials, an
endpoint that does not answer. They are not capacity, quota or throttling: the lifecycle skips AWS
once and goes on with the other clouds (docs/ERRORS.md). botocore is imported lazily.

Also the bounded client settings every AWS client gets, so a dead endpoint fails in seconds:
botocore's "standard" retry mode (3 attempts, jittered backoff) and connect/read timeouts.
"""

from __future__ import annotations

import os
from typing import Any

from gpucloud.errors import CloudAccessError, CredentialsError, EndpointError

CLOUD = "aws"
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 30
MAX_ATTEMPTS = 3  # in all, first try included (botocore's `total_max_attempts`)
# STS GetCallerIdentity is the first call of every run (the channel's account): an endpoint that
# accepts connections but never answers is found out by it within PROBE_READ_TIMEOUT_S x 2.
PROBE_SERVICES = frozenset({"sts"})
PROBE_READ_TIMEOUT_S = 5

# ClientError codes that say the credentials themselves are wrong, expired or unknown.
CREDENTIAL_CODES = frozenset({
    "InvalidClientTokenId", "UnrecognizedClientException", "AuthFailure", "SignatureDoesNotMatch",
    "ExpiredToken", "ExpiredTokenException", "InvalidAccessKeyId", "InvalidToken", "RequestExpired",
    "IncompleteSignature", "MissingAuthenticationToken",
})
CREDENTIALS_HINT = ("Configure the standard AWS credential chain: `aws configure`, `aws sso login`, AWS_PROFILE, "
                    "or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; `gpucloud check --cloud aws` tests them.")


def client_config(service: str = "", **extra: Any) -> Any:
    """The botocore Config every gpucloud AWS client uses: bounded retries and timeouts (shorter
    for the cheap identity probe, see PROBE_SERVICES)."""
    from botocore.config import Config

    probe = service in PROBE_SERVICES
    return Config(retries={"mode": "standard", "total_max_attempts": 2 if probe else MAX_ATTEMPTS},
                  connect_timeout=CONNECT_TIMEOUT_S, read_timeout=PROBE_READ_TIMEOUT_S if probe else READ_TIMEOUT_S,
                  user_agent_extra="gpucloud", **extra)


def endpoint_of(exc: BaseException) -> str:
    """The URL botocore was trying to reach, else the configured override, else "the AWS endpoint"."""
    kwargs = getattr(exc, "kwargs", None) or {}
    url = kwargs.get("endpoint_url") or getattr(exc, "endpoint_url", None)
    return str(url or os.environ.get("AWS_ENDPOINT_URL") or "the AWS endpoint")


def first_line(text: str) -> str:
    """The one line of an SDK message that matters (SDKs add tracebacks and troubleshooting links)."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


def classify_access(exc: BaseException, *, what: str = "") -> CloudAccessError | None:
    """CredentialsError / EndpointError for an AWS SDK error that makes AWS unusable; None for any
    other error (the caller classifies those as capacity, quota, throttle ...)."""
    from botocore import exceptions as be

    during = f" while {what}" if what else ""
    if isinstance(exc, CloudAccessError):
        return exc
    if isinstance(exc, (be.NoCredentialsError, be.PartialCredentialsError, be.CredentialRetrievalError,
                        be.ProfileNotFound, be.NoAuthTokenError)) or type(exc).__name__ in (
            "TokenRetrievalError", "SSOTokenLoadError", "UnauthorizedSSOTokenError"):
        return CredentialsError(f"AWS: no usable credentials{during}: {first_line(str(exc))}.", cloud=CLOUD,
                                hint=CREDENTIALS_HINT)
    from gpucloud.providers.aws import error_code, error_message

    code = error_code(exc)
    if code in CREDENTIAL_CODES:
        return CredentialsError(f"AWS refused the credentials{during} ({code}: {first_line(error_message(exc))}).",
                                cloud=CLOUD, hint=CREDENTIALS_HINT)
    if isinstance(exc, (be.EndpointConnectionError, be.ConnectTimeoutError, be.ProxyConnectionError,
                        be.SSLError, be.ReadTimeoutError)):  # read timeout: botocore already retried it
        url = endpoint_of(exc)
        override = os.environ.get("AWS_ENDPOINT_URL")
        hint = (f"AWS_ENDPOINT_URL is set to {override}: unset it to use AWS itself, or start the service there."
                if override else "Check the network (proxy, firewall, VPN) and the region name.")
        return EndpointError(f"AWS: could not reach {url}{during} ({type(exc).__name__}; botocore retried "
                             f"with a {CONNECT_TIMEOUT_S} s connect timeout and gave up).",
                             cloud=CLOUD, hint=hint)
    return None
