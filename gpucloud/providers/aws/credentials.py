"""Whether the AWS credentials last as long as the run (docs/PROVIDERS.md, "AWS credentials").

The node no longer depends on them: it signs its own S3 requests with its instance profile
(identity.py), so a run outlives the credentials that launched it. What still does depend on them
is this CLI: temporary credentials that botocore cannot refresh by itself end its following and
its teardown. That is worth a warning before launch, not a refusal: the run delivers its log,
status and artifacts, ends itself at its deadline, and `gpucloud logs`/`down`/`gc` with fresh
credentials do the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from gpucloud.contract.provider import expiry_tag
from gpucloud.providers.aws.access import no_credentials

# Credential sources botocore refreshes by itself (this CLI keeps working past the first expiry).
REFRESHING = frozenset(
    {"iam-role", "container-role", "assume-role", "assume-role-with-web-identity", "sso", "custom-process"}
)


def credentials_warning(session: Any, deadline: datetime) -> str | None:
    """None when the credentials last past `deadline` or refresh themselves, else the warning. Raises
    CredentialsError when there are no credentials at all (the failover skips AWS)."""
    creds = session.get_credentials()
    if creds is None:
        raise no_credentials()
    try:
        token = creds.get_frozen_credentials().token
    except Exception:  # noqa: BLE001 - a refresh failure shows up on the first real call
        return None
    expiry = getattr(creds, "_expiry_time", None)
    if not token or expiry is None:
        return None  # long-term keys, or a lifetime nobody told us
    if expiry.tzinfo is None:
        expiry = expiry.replace(tzinfo=UTC)
    method = str(getattr(creds, "method", "") or "temporary")
    if expiry >= deadline or method in REFRESHING:
        return None
    left = max(0, int((expiry - datetime.now(UTC)).total_seconds() // 60))
    return (
        f"the AWS credentials ({method}) are temporary and expire at {expiry_tag(expiry)} (in {left} min), "
        f"before this run's deadline {expiry_tag(deadline)}. The run itself goes on (its machine signs with "
        "a role of its own and delivers its log, status and artifacts), but from then on this CLI cannot "
        "follow it or tear it down: run `gpucloud logs RUN`, `gpucloud collect RUN` and `gpucloud down RUN` "
        "with fresh credentials. The machine still ends itself at its deadline and `gpucloud gc` removes "
        "anything left."
    )


def warn_once(
    seen: set[str], key: str, message: str | None, warn: Callable[[str], None], journal: Any = None, run_id: str = ""
) -> None:
    """Show a warning once per key (a run's several attempts share it), and journal it."""
    if message is None or key in seen:
        return
    seen.add(key)
    warn(message)
    if journal is not None:
        try:
            journal.event(run_id, "warning", message)
        except Exception:  # noqa: BLE001 - a warning must never stop a launch
            pass
