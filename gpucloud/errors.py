"""Error classes that carry their CLI exit code, so every layer can fail clearly without tracebacks."""

from __future__ import annotations

import re


def render_items(message: str, items: list[str], hint: str | None) -> str:
    """A message, one "  - item" line per item (attempt, cloud), then the fix."""
    return "\n".join([message, *(f"  - {item}" for item in items), *([hint] if hint else [])])


class GpucloudError(Exception):
    """Base class: `message` is one readable paragraph; `exit_code` is what the CLI returns."""

    exit_code: int = 70

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self) -> str:
        """The paragraph shown to the user (message, then the fix when there is one)."""
        return self.message if not self.hint else f"{self.message}\n{self.hint}"


class UserError(GpucloudError):
    """Bad input: a job file, a pin, a flag, a request nobody offers. Exit 2."""

    exit_code = 2


class NoCandidateError(GpucloudError):
    """Every candidate of the plan failed to provision. Exit 75; `attempts` lists each one.
    `capacity`: at least one failed for want of capacity, quota or price (the run is `no-capacity`);
    otherwise each failed for its own reason (a missing image, a refused size) and the run is `error`."""

    exit_code = 75

    def __init__(self, message: str, attempts: list[str], *, hint: str | None = None, capacity: bool = True) -> None:
        super().__init__(message, hint=hint)
        self.attempts = attempts
        self.capacity = capacity

    def render(self) -> str:
        return render_items(self.message, self.attempts, self.hint)


class SessionUnsupported(GpucloudError):
    """`gpucloud ssh` on a provider with no way into a node that opens nothing to the world. Exit 78."""

    exit_code = 78


class InternalError(GpucloudError):
    """A bug or an unexpected cloud answer. Exit 70."""

    exit_code = 70


class CloudAccessError(GpucloudError):
    """A cloud cannot be used at all: no or bad credentials, or an endpoint that does not answer.
    Distinct from capacity, quota and throttling: failover skips the whole cloud once, and when no
    cloud is usable the run ends with exit 78 (configuration). `cloud` names the cloud."""

    exit_code = 78
    kind = "credentials"

    def __init__(self, message: str, *, cloud: str = "", hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.cloud = cloud


class CredentialsError(CloudAccessError):
    """No credentials found, or the cloud refused them (expired, wrong keys, no subscription)."""

    kind = "credentials"


class EndpointError(CloudAccessError):
    """The cloud's API endpoint could not be reached (wrong or dead AWS_ENDPOINT_URL, no network)."""

    kind = "endpoint"


class ConfigurationError(GpucloudError):
    """Nothing usable is configured (no cloud has working credentials). Exit 78 (EX_CONFIG);
    `reasons` holds one line per cloud."""

    exit_code = 78

    def __init__(self, message: str, reasons: list[str], *, hint: str | None = None, shown: bool = False) -> None:
        super().__init__(message, hint=hint)
        self.reasons = reasons
        self.shown = shown  # each reason was printed already, as it happened: not again

    def render(self) -> str:
        return render_items(self.message, [] if self.shown else self.reasons, self.hint)


class Declined(GpucloudError):
    """The user answered no to a confirmation (or there was nobody to ask and --yes was not given). Exit 1."""

    exit_code = 1


def error_kind(exc: BaseException) -> str:
    """A stable short word for machines (the `kind` of the --json error document and of the CI
    annotations): an explicit `kind` attribute, else the class name: SpecError -> "spec",
    NoCandidateError -> "no-candidate", ConfigurationError -> "configuration"."""
    kind = getattr(exc, "kind", None)
    if isinstance(kind, str) and kind:
        return kind
    name = re.sub(r"(Error|Exceeded)$", "", type(exc).__name__) or type(exc).__name__
    return re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()
