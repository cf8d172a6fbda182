"""Whether the AWS credentials last as long as the run (docs/PROVIDERS.md, "AWS credentials").

A presigned URL stops working when the credentials that signed it expire, whatever its own
expiry, so temporary credentials that end before the run's deadline cut the VM off from its logs,
status and artifacts. That is worth a warning, not a refusal: the VM still ends itself at its
deadline and `gpucloud gc` removes anything left.
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
    """None when the credentials last past `deadline`, else the warning to show. Raises
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
    if expiry >= deadline:
        return None
    method = str(getattr(creds, "method", "") or "temporary")
    left = max(0, int((expiry - datetime.now(UTC)).total_seconds() // 60))
    return (
        f"the AWS credentials ({method}) are temporary and expire at {expiry_tag(expiry)} (in {left} min), "
        f"before this run's deadline {expiry_tag(deadline)}. The VM's presigned URLs die with the credentials "
        "that signed them, so from then on the run cannot send logs, status or artifacts"
        + ("" if method in REFRESHING else ", and this CLI cannot follow or tear it down")
        + ". The VM still ends itself at its deadline and `gpucloud gc` removes anything left. "
        "Use credentials that last past the deadline (a longer role session duration, up to 12 h, or "
        "long-term keys of a user with `gpucloud iam-policy aws`), or a shorter max_duration."
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
