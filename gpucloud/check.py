"""`gpucloud check`: can this machine use each cloud, as whom, where, and with how much GPU quota?

Per cloud, concurrently, each bounded to CHECK_TIMEOUT_S: credentials found or not; whose they are
(AWS: account and ARN from STS GetCallerIdentity; Azure: subscription and tenant); the enabled
regions (EC2 DescribeRegions; ARM subscriptions/locations); for AWS the GPU vCPU quotas the tool
knows (Service Quotas GetServiceQuota) where Service Quotas answers. Every problem comes with its
fix. Exit 0 when at least one checked cloud is usable, else 78 (configuration).
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any

CHECK_TIMEOUT_S = 10.0
# The GPU vCPU quotas that limit the instance types gpucloud launches (providers/aws.py, quota_for).
AWS_GPU_QUOTAS = {
    "L-417A185B": "Running On-Demand P instances",
    "L-DB2E81BA": "Running On-Demand G and VT instances",
    "L-7212CCBC": "All P Spot Instance Requests",
    "L-3819A6DF": "All G and VT Spot Instance Requests",
}
ARM_API_VERSION = "2022-12-01"


@dataclass
class CloudCheck:
    """What `check` found about one cloud; `usable` when credentials work and the API answered."""

    cloud: str
    usable: bool = False
    credentials: bool = False
    identity: dict[str, str] = field(default_factory=dict)
    regions: list[str] = field(default_factory=list)
    quotas: list[dict[str, Any]] = field(default_factory=list)
    problems: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    def problem(self, problem: str, fix: str | None) -> None:
        self.problems.append({"problem": problem, "fix": fix or ""})

    def as_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["seconds"] = round(self.seconds, 3)
        return doc


# ---- AWS -------------------------------------------------------------------------------------------

def check_aws() -> CloudCheck:
    import boto3

    from gpucloud.providers.aws_access import CREDENTIALS_HINT, classify_access, client_config

    result = CloudCheck("aws")
    session = boto3.Session()
    region = session.region_name or "us-east-1"
    try:
        if session.get_credentials() is None:
            result.problem("no AWS credentials found (environment, ~/.aws, SSO or instance role)", CREDENTIALS_HINT)
            return result
        result.credentials = True
        who = session.client("sts", region_name=region, config=client_config("sts")).get_caller_identity()
        result.identity = {"account": str(who.get("Account", "")), "arn": str(who.get("Arn", ""))}
        ec2 = session.client("ec2", region_name=region, config=client_config())
        result.regions = sorted(r["RegionName"] for r in ec2.describe_regions().get("Regions", []))
        result.usable = True
    except Exception as exc:  # noqa: BLE001 - every failure becomes a problem with its fix
        access = classify_access(exc)
        if access is not None:
            result.credentials = result.credentials and access.kind != "credentials"
            result.problem(access.message, access.hint)
        else:
            result.problem(f"AWS answered {type(exc).__name__}: {exc}",
                           "The identity needs ec2:DescribeRegions and sts:GetCallerIdentity "
                           "(`gpucloud iam-policy aws` prints the full policy).")
        return result
    _aws_quotas(session, region, result)
    return result


def _aws_quotas(session: Any, region: str, result: CloudCheck) -> None:
    """GPU vCPU quotas in the session's region; a refusal is noted, not fatal (the quotas are advice)."""
    from gpucloud.providers.aws_access import client_config

    client = session.client("service-quotas", region_name=region, config=client_config())
    for code, name in AWS_GPU_QUOTAS.items():
        try:
            value = client.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
        except Exception as exc:  # noqa: BLE001
            result.quotas.append({"code": code, "name": name, "region": region, "vcpus": None,
                                  "note": f"Service Quotas did not answer ({type(exc).__name__})"})
            continue
        result.quotas.append({"code": code, "name": name, "region": region, "vcpus": float(value), "note": ""})
        if float(value) == 0:
            result.problem(f"quota {code} ({name}) is 0 vCPUs in {region}: no such GPU machine can start there",
                           f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {code} "
                           f"--region {region} --desired-value <vCPUs>")


# ---- Azure -----------------------------------------------------------------------------------------

def check_azure() -> CloudCheck:
    from gpucloud.providers.azure_access import (CREDENTIALS_HINT, arm_endpoint, classify_access,
                                                 default_credential)

    result = CloudCheck("azure")
    sub = os.environ.get("AZURE_SUBSCRIPTION_ID", "")
    arm = arm_endpoint().rstrip("/")
    try:
        token = default_credential().get_token(f"{arm}/.default").token
        result.credentials = True
        if not sub:
            result.problem("AZURE_SUBSCRIPTION_ID is not set",
                           "Set it to the subscription to run in (`az account show --query id -o tsv`).")
            return result
        info = _arm_get(f"{arm}/subscriptions/{sub}?api-version={ARM_API_VERSION}", token)
        result.identity = {"subscription": sub, "tenant": str(info.get("tenantId", "")),
                           "name": str(info.get("displayName", "")), "state": str(info.get("state", ""))}
        locations = _arm_get(f"{arm}/subscriptions/{sub}/locations?api-version={ARM_API_VERSION}", token)
        result.regions = sorted(str(loc.get("name")) for loc in locations.get("value", []))
        result.usable = True
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")[:300]
        result.problem(f"Azure Resource Manager answered HTTP {exc.code} for subscription {sub}: {body}",
                       "Check AZURE_SUBSCRIPTION_ID and that the signed-in identity has a role on it.")
    except OSError as exc:  # URLError, timeouts
        result.problem(f"Azure: could not reach {arm} ({getattr(exc, 'reason', exc)})",
                       "Check the network, or GPUCLOUD_AZURE_ARM_ENDPOINT if it is set.")
    except Exception as exc:  # noqa: BLE001
        access = classify_access(exc)
        result.problem(access.message if access else f"Azure: {type(exc).__name__}: {exc}",
                       access.hint if access else CREDENTIALS_HINT)
    return result


def _arm_get(url: str, token: str) -> dict[str, Any]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 - the ARM endpoint
        return dict(json.loads(resp.read().decode() or "{}"))


# ---- running and showing ------------------------------------------------------------------------------

CHECKS = {"aws": check_aws, "azure": check_azure}


def run_checks(clouds: list[str], timeout: float = CHECK_TIMEOUT_S) -> list[CloudCheck]:
    """Every cloud's check at once, in daemon threads (a hung SDK call must not keep the process
    alive); one that takes longer than `timeout` is reported as such."""
    found: dict[str, CloudCheck] = {}
    threads = [threading.Thread(target=lambda c=c: found.__setitem__(c, _timed(c)), daemon=True) for c in clouds]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    results = []
    for cloud in clouds:
        result = found.get(cloud)
        if result is None:
            result = CloudCheck(cloud, seconds=timeout)
            result.problem(f"{cloud}: no answer within {timeout:.0f} s", "Check the network and the endpoint settings.")
        results.append(result)
    return results


def _timed(cloud: str) -> CloudCheck:
    t0 = time.monotonic()
    try:
        result = CHECKS[cloud]()
    except Exception as exc:  # noqa: BLE001 - a check never crashes the command
        result = CloudCheck(cloud)
        result.problem(f"{cloud}: the check failed: {type(exc).__name__}: {exc}", None)
    result.seconds = time.monotonic() - t0
    return result


def print_checks(results: list[CloudCheck]) -> None:
    """Human report: one block per cloud; problems with their fixes."""
    for r in results:
        head = "ok" if r.usable else "NOT USABLE"
        print(f"{r.cloud}: {head} ({r.seconds:.1f}s)")
        if r.identity:
            print("  identity  " + ", ".join(f"{k} {v}" for k, v in r.identity.items() if v))
        if r.regions:
            print(f"  regions   {len(r.regions)} enabled: {', '.join(r.regions)}")
        for q in r.quotas:
            value = "unknown" if q["vcpus"] is None else f"{q['vcpus']:g} vCPUs"
            print(f"  quota     {q['code']} {q['name']} ({q['region']}): {value}" + (f" ({q['note']})" if q["note"] else ""))
        for p in r.problems:
            print(f"  problem   {p['problem']}")
            if p["fix"]:
                print(f"  fix       {p['fix']}")


def check_command(cloud: str | None, *, json_out: bool) -> int:
    """`gpucloud check`: returns the exit code (0 if some checked cloud is usable, else 78)."""
    from gpucloud.jsonout import emit

    clouds = [cloud] if cloud else list(CHECKS)
    results = run_checks(clouds)
    code = 0 if any(r.usable for r in results) else 78
    if json_out:
        emit({"clouds": [r.as_json() for r in results], "usable": [r.cloud for r in results if r.usable],
              "exit_code": code})
    else:
        print_checks(results)
    return code
