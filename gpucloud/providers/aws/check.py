"""`gpucloud check` for AWS: credentials found, whose (STS GetCallerIdentity), the enabled regions
(EC2 DescribeRegions) and the GPU vCPU quotas the tool launches against (Service Quotas), each
problem with its fix; and `identity`, the one call `run` makes before its launch prompt. Every
client has the bounded config of session.py."""

from __future__ import annotations

from typing import Any

from gpucloud.contract.provider import CloudCheck
from gpucloud.providers.aws.access import CREDENTIALS_HINT, classify_access, no_credentials
from gpucloud.providers.aws.errors import error_code, gpu_quotas
from gpucloud.providers.aws.network import CLOUD
from gpucloud.providers.aws.session import client_config


def check() -> CloudCheck:
    import boto3

    result = CloudCheck(CLOUD)
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
            result.problem(
                f"AWS answered {type(exc).__name__}: {exc}",
                "The identity needs ec2:DescribeRegions and sts:GetCallerIdentity "
                "(`gpucloud iam-policy aws` prints the full policy).",
            )
        return result
    _quotas(session, region, result)
    return result


def identity() -> str:
    """Whose the credentials are, asked of STS (GetCallerIdentity needs no permission, so only
    credentials that do not work fail it), with the probe's short timeouts: a refused key or a
    dead endpoint is found before anyone is asked to launch (CredentialsError/EndpointError). Any
    other answer (throttling, an AWS-side error) says nothing about the credentials: the cloud is
    kept, and the failover meets that error, with its retries, if it lasts."""
    import boto3

    try:
        session = boto3.Session()
        if session.get_credentials() is None:
            raise no_credentials()
        sts = session.client("sts", region_name=session.region_name or "us-east-1", config=client_config("sts"))
        who = sts.get_caller_identity()
    except Exception as exc:  # noqa: BLE001 - classified below; only access errors drop the cloud
        access = classify_access(exc, what="checking the credentials (STS GetCallerIdentity)")
        if access is not None:
            raise access from None
        return f"not confirmed ({error_code(exc) or type(exc).__name__})"
    return f"account {who.get('Account', '?')} ({who.get('Arn', '?')})"


def _quotas(session: Any, region: str, result: CloudCheck) -> None:
    """GPU vCPU quotas in the session's region; a refusal is noted, not fatal (the quotas are advice)."""
    client = session.client("service-quotas", region_name=region, config=client_config())
    for code, name in gpu_quotas().items():
        try:
            value = float(client.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
        except Exception as exc:  # noqa: BLE001
            result.quotas.append(
                {
                    "code": code,
                    "name": name,
                    "region": region,
                    "vcpus": None,
                    "note": f"Service Quotas did not answer ({type(exc).__name__})",
                }
            )
            continue
        result.quotas.append({"code": code, "name": name, "region": region, "vcpus": value, "note": ""})
        if value == 0:
            result.problem(
                f"quota {code} ({name}) is 0 vCPUs in {region}: no such GPU machine can start there",
                f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {code} "
                f"--region {region} --desired-value <vCPUs>",
            )
