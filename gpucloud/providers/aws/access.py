"""AWS errors that mean "this cloud cannot be used at all": missing or refused credentials, an
endpoint that does not answer (docs/PROVIDERS.md, "AWS errors"). They are not capacity, quota or
throttling: the failover skips AWS once and goes on with the other clouds, and the retrying call
(session.py) raises them at once instead of retrying. botocore is imported lazily.
"""

from __future__ import annotations

import os
import re

from gpucloud.errors import CloudAccessError, CredentialsError, EndpointError
from gpucloud.providers.aws.errors import error_code, error_message

CLOUD = "aws"
# ClientError codes that say the credentials themselves are wrong, expired or unknown.
CREDENTIAL_CODES = frozenset(
    {
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "AuthFailure",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidAccessKeyId",
        "InvalidToken",
        "RequestExpired",
        "IncompleteSignature",
        "MissingAuthenticationToken",
    }
)
# EC2 answers AuthFailure also for an AMI the account may not launch ("Not authorized for images").
_AMI_REFUSED = re.compile(r"\bimages?\b|\bami-[0-9a-f]+", re.I)
# The identity lacks a permission: the account is usable, its policy is not enough (exit 78 too).
PERMISSION_CODES = frozenset({"UnauthorizedOperation", "AccessDenied", "AccessDeniedException"})
PERMISSION_HINT = (
    "Give the identity the policy `gpucloud iam-policy aws` prints (it lists every action gpucloud "
    "calls); `gpucloud check --cloud aws` tests the credentials."
)
CREDENTIALS_HINT = (
    "Configure the standard AWS credential chain: `aws configure`, `aws sso login`, AWS_PROFILE, "
    "or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; `gpucloud check --cloud aws` tests them."
)
# botocore exceptions (by name) that mean the credential chain found nothing usable.
_NO_CREDENTIALS = frozenset(
    {
        "NoCredentialsError",
        "PartialCredentialsError",
        "CredentialRetrievalError",
        "ProfileNotFound",
        "NoAuthTokenError",
        "TokenRetrievalError",
        "SSOTokenLoadError",
        "UnauthorizedSSOTokenError",
    }
)


def no_credentials() -> CredentialsError:
    """The chain found no credentials at all (raised before any call)."""
    return CredentialsError(
        "AWS: no credentials found (environment, ~/.aws, SSO or instance role).", cloud=CLOUD, hint=CREDENTIALS_HINT
    )


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
    if any(cls.__name__ in _NO_CREDENTIALS for cls in type(exc).__mro__):
        return CredentialsError(
            f"AWS: no usable credentials{during}: {first_line(str(exc))}.", cloud=CLOUD, hint=CREDENTIALS_HINT
        )
    code = error_code(exc)
    if code == "AuthFailure" and _AMI_REFUSED.search(error_message(exc)):
        return None  # "Not authorized for images: [ami-...]": this candidate's image, not the credentials
    if code in CREDENTIAL_CODES:
        return CredentialsError(
            f"AWS refused the credentials{during} ({code}: {first_line(error_message(exc))}).",
            cloud=CLOUD,
            hint=CREDENTIALS_HINT,
        )
    if isinstance(
        exc,
        (be.EndpointConnectionError, be.ConnectTimeoutError, be.ProxyConnectionError, be.SSLError, be.ReadTimeoutError),
    ):  # botocore already retried it
        override = os.environ.get("AWS_ENDPOINT_URL")
        hint = (
            f"AWS_ENDPOINT_URL is set to {override}: unset it to use AWS itself, or start the service there."
            if override
            else "Check the network (proxy, firewall, VPN) and the region name."
        )
        return EndpointError(
            f"AWS: could not reach {endpoint_of(exc)}{during} ({type(exc).__name__}; "
            "botocore retried with short timeouts and gave up).",
            cloud=CLOUD,
            hint=hint,
        )
    return None


class PermissionDenied(CloudAccessError):
    """The credentials work but their policy lacks an action gpucloud calls: every candidate of the
    cloud would be refused the same way, so the cloud is skipped and a run with no other cloud
    exits 78, naming the action."""

    kind = "permission"

    def __init__(self, message: str, *, action: str, cloud: str = CLOUD, hint: str | None = PERMISSION_HINT) -> None:
        super().__init__(message, cloud=cloud, hint=hint)
        self.action = action


def permission_denied(exc: BaseException, *, service: str, what: str = "") -> PermissionDenied | None:
    """PermissionDenied for an AWS answer that refuses an action to this identity, else None. The
    action is the one AWS names ("is not authorized to perform: ec2:RunInstances"), else the
    service and operation of the refused call. Not part of classify_access: some callers expect
    AccessDenied as an answer (a bucket of another account, an SSM parameter they may skip)."""
    code = error_code(exc)
    if code.rsplit(".", 1)[-1] not in PERMISSION_CODES:
        return None
    message = error_message(exc)
    named = re.search(r"perform: ?([A-Za-z0-9-]+:[A-Za-z0-9]+)", message)
    operation = str(getattr(exc, "operation_name", "") or "")
    action = named[1] if named else f"{service}:{operation}" if operation else service
    during = f" while {what}" if what else ""
    return PermissionDenied(
        f"AWS denied {action}{during}: the identity's policy does not allow it ({code}: {first_line(message)[:300]}).",
        action=action,
    )
