"""`gpucloud check` for AWS: credentials found, whose (STS GetCallerIdentity), the enabled regions
(EC2 DescribeRegions) and the GPU vCPU quotas the tool launches against (Service Quotas), each
problem with its fix; and `identity`, the one call `run` makes before its launch prompt. Every
client has the bounded config of session.py."""

from __future__ import annotations

import time
from typing import Any

from gpucloud.contract.provider import CloudCheck
from gpucloud.providers.aws.access import CREDENTIALS_HINT, classify_access, no_credentials
from gpucloud.providers.aws.errors import error_code, gpu_quotas
from gpucloud.providers.aws.network import CLOUD
from gpucloud.providers.aws.quota import raise_command, region_quotas
from gpucloud.providers.aws.session import shared_client, shared_session

# The quotas are read until this many seconds into the check (run/check.py gives it 10 s in all):
# on a slow or busy machine the rest are "unknown", rather than the whole check lost.
QUOTAS_BY_S = 7.0


def check() -> CloudCheck:
    started = time.monotonic()

    result = CloudCheck(CLOUD)
    session = shared_session()
    region = session.region_name or "us-east-1"
    try:
        if session.get_credentials() is None:
            result.problem("no AWS credentials found (environment, ~/.aws, SSO or instance role)", CREDENTIALS_HINT)
            return result
        result.credentials = True
        who = shared_client(session, "sts", region).get_caller_identity()
        result.identity = {"account": str(who.get("Account", "")), "arn": str(who.get("Arn", ""))}
        ec2 = shared_client(session, "ec2", region)
        result.regions = sorted(r["RegionName"] for r in ec2.describe_regions().get("Regions", []))
        result.usable = True
    except Exception as exc:  # noqa: BLE001 - every failure becomes a problem with its fix
        access = classify_access(exc)
        if access is not None:
            result.credentials = result.credentials and access.kind != "credentials"
            result.problem(access.message, access.hint)
        else:
            result.problem(
                f"AWS answered {type(exc).__name__}: {exc}",
                "The identity needs ec2:DescribeRegions and sts:GetCallerIdentity "
                "(`gpucloud iam-policy aws` prints the full policy).",
            )
        return result
    _setup_pieces(result.identity["account"], result)  # a few IAM reads: before the quotas' budget
    _quotas(session, region, result, budget_s=max(1.0, QUOTAS_BY_S - (time.monotonic() - started)))
    return result


def identity() -> str:
    """Whose the credentials are, asked of STS (GetCallerIdentity needs no permission, so only
    credentials that do not work fail it), with the probe's short timeouts: a refused key or a
    dead endpoint is found before anyone is asked to launch (CredentialsError/EndpointError). Any
    other answer (throttling, an AWS-side error) says nothing about the credentials: the cloud is
    kept, and the failover meets that error, with its retries, if it lasts. The process's shared
    session and client: a session of its own would parse botocore's endpoint data again."""
    try:
        session = shared_session()
        if session.get_credentials() is None:
            raise no_credentials()
        sts = shared_client(session, "sts", session.region_name or "us-east-1")
        who = sts.get_caller_identity()
    except Exception as exc:  # noqa: BLE001 - classified below; only access errors drop the cloud
        access = classify_access(exc, what="checking the credentials (STS GetCallerIdentity)")
        if access is not None:
            raise access from None
        return f"not confirmed ({error_code(exc) or type(exc).__name__})"
    return f"account {who.get('Account', '?')} ({who.get('Arn', '?')})"


def _quotas(session: Any, region: str, result: CloudCheck, budget_s: float) -> None:
    """GPU vCPU quotas per family in every enabled region (the session's first), read at once; a
    refusal is noted, not fatal (the quotas are advice). A quota of 0 is a problem, one per family,
    naming the regions and the request command."""
    regions = [region, *(r for r in result.regions if r != region)]
    result.quotas.extend(region_quotas(regions, budget_s))
    zero: dict[str, list[str]] = {}
    for q in result.quotas:
        if q["vcpus"] == 0:
            zero.setdefault(str(q["code"]), []).append(str(q["region"]))
    names = gpu_quotas()
    for code, where in zero.items():
        result.problem(
            f"quota {code} ({names[code]}) is 0 vCPUs in {', '.join(where)}: no such GPU machine can start there",
            raise_command(code, where[0] if len(where) == 1 else "<region>"),
        )


def _setup_pieces(account: str, result: CloudCheck) -> None:
    """The pieces `gpucloud setup aws` creates, each with its state; a missing or changed deadline
    role is a problem with its fix (the runner policies are one way among others to grant the
    permissions). Reading them needs the runner policy's iam:Get* (a refusal is noted, never fatal)."""
    from gpucloud.providers.aws.session import shared_client, shared_session
    from gpucloud.providers.aws.setup import AwsSetup

    try:
        pieces = AwsSetup(shared_client(shared_session(), "iam", "us-east-1"), account).inspect()
    except Exception as exc:  # noqa: BLE001
        result.setup.append(
            {"piece": "setup", "state": "unknown", "detail": f"not readable ({error_code(exc) or type(exc).__name__})"}
        )
        return
    for p in pieces:
        result.setup.append({"piece": p["piece"], "state": p["state"], "detail": p["detail"]})
        if p["state"] != "present" and p["kind"] == "deadline-role":  # the runner policies are optional
            result.problem(
                f"{p['piece']} is {p['state']} (runs go on without the cloud-side deadline)",
                "An administrator runs `gpucloud setup aws` (or `gpucloud setup aws --print` for the commands).",
            )
