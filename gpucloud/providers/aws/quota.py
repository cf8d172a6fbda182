"""The EC2 vCPU quotas of the GPU families, per region (Service Quotas), read before a launch and by
`gpucloud check`.

A new account has 0 vCPUs of G and P instances in every region; without this a run learns that
only from a failed RunInstances per region. Each (region, quota code) is read once, all of them at
once in daemon threads, within one budget: a lookup that is refused (AccessDenied), not known to
the endpoint, or slow is a note, never a refusal (the launch then finds out as before). The
applied value is read first; a quota never raised has none, and AWS's default is read then.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from gpucloud.providers.aws.errors import error_code, gpu_quotas, quota_for

BUDGET_S = 4.0  # all lookups of one run together (the run's time to its launch prompt)


def raise_command(code: str, region: str) -> str:
    """The AWS CLI command that asks for more of this quota (docs/AWS.md, "Quotas")."""
    return (
        f"aws service-quotas request-service-quota-increase --service-code ec2 "
        f"--quota-code {code} --region {region} --desired-value <vCPUs>"
    )


def read_quota(session: Any, region: str, code: str) -> tuple[float | None, str]:
    """(vCPUs, note): the applied value, else AWS's default; None and why when neither answers."""
    from gpucloud.providers.aws.session import shared_client

    client = shared_client(session, "service-quotas", region)
    try:
        return float(client.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]), ""
    except Exception as exc:  # noqa: BLE001 - a lookup is advice (module doc)
        if "NoSuchResource" not in error_code(exc):
            return None, f"Service Quotas did not answer ({error_code(exc) or type(exc).__name__})"
    try:
        answer = client.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)
        return float(answer["Quota"]["Value"]), "AWS default"
    except Exception as exc:  # noqa: BLE001
        return None, f"Service Quotas did not answer ({error_code(exc) or type(exc).__name__})"


def read_many(
    keys: list[tuple[str, str]], budget_s: float = BUDGET_S
) -> dict[tuple[str, str], tuple[float | None, str]]:
    """(region, code) -> (vCPUs, note) for every key, read concurrently within `budget_s`."""
    from gpucloud.providers.aws.session import shared_session

    found: dict[tuple[str, str], tuple[float | None, str]] = {}
    try:
        session = shared_session()
    except Exception as exc:  # noqa: BLE001 - no session: every lookup is a note
        return {k: (None, f"no AWS session ({type(exc).__name__})") for k in keys}

    def one(key: tuple[str, str]) -> None:
        found[key] = read_quota(session, *key)

    threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in dict.fromkeys(keys)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + budget_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return {k: found.get(k, (None, f"Service Quotas gave no answer within {budget_s:g} s")) for k in keys}


def verdicts(asks: list[dict[str, Any]], budget_s: float = BUDGET_S) -> list[dict[str, Any]]:
    """Per ask ({region, instance_type, spot, vcpus}: the vCPUs the launch needs in all), whether
    the region's quota of that family can hold it: `fits` True, False, or None (unknown, `note`
    says why). The quota counts running vCPUs, so a limit at or above the need may still be taken
    by other machines; only a limit below it is certain to refuse."""
    coded = [(a, *quota_for(str(a["instance_type"]), bool(a["spot"]))) for a in asks]
    values = read_many([(str(a["region"]), code) for a, code, _ in coded], budget_s)
    out = []
    for ask, code, name in coded:
        region, need = str(ask["region"]), float(ask.get("vcpus") or 0)
        limit, note = values[(region, code)]
        fits = None if limit is None or not need else limit >= need
        out.append(
            {
                "region": region,
                "instance_type": ask["instance_type"],
                "spot": bool(ask["spot"]),
                "code": code,
                "name": name,
                "limit": limit,
                "need": need,
                "fits": fits,
                "note": note,
                "fix": raise_command(code, region),
            }
        )
    return out


def region_quotas(regions: list[str], budget_s: float = 5.0) -> list[dict[str, Any]]:
    """Every GPU quota code in each region (`gpucloud check`): {code, name, region, vcpus, note};
    within `budget_s`, well inside check's own 10 s (a slow lookup is "unknown", with its note)."""
    names = gpu_quotas()
    keys = [(r, code) for r in regions for code in names]
    values = read_many(keys, budget_s)
    return [
        {"code": code, "name": names[code], "region": r, "vcpus": values[(r, code)][0], "note": values[(r, code)][1]}
        for r, code in keys
    ]
