"""`inputs:` with `mode: mount` on S3 (docs/DATA.md): the machine mounts the folder read-only with
rclone, so it needs credentials that can list and read under that prefix, which a presigned URL per
object cannot give. The caller asks STS for a federation token (GetFederationToken) whose session
policy allows exactly s3:ListBucket on the bucket for that prefix and s3:GetObject under it, and
which expires at the run's deadline (STS's bounds: 15 minutes to 36 hours). The token's rights are
the intersection of that policy and the caller's own IAM user policy; it rides sealed to the node's
key with the other grants (gpucloud/run/secrets.py). Role and SSO session credentials cannot call
GetFederationToken: that is refused before launch, naming the fix, unless the job runs only on AWS.

On AWS the node has a role of its own (identity.py), given the mounted folder by its data policy
(data.node_statements): its rclone then reads the instance profile's credentials itself
(`env_auth`, from IMDS, refreshed by EC2 for the whole run), so the caller needs no federation
token, any credentials do (SSO, assumed role, OIDC), and the 36 hours do not apply.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from gpucloud.errors import UserError
from gpucloud.providers.aws.data import bucket_region, s3_client
from gpucloud.providers.aws.session import client_config, shared_session

MIN_TOKEN_S = 900  # STS GetFederationToken's DurationSeconds bounds
MAX_TOKEN_S = 129600
NAME_PREFIX = "gc-"  # federated user names: gc-<end of the run id>, 32 characters at most
REFUSED = ("AccessDenied", "InvalidClientTokenId", "UnrecognizedClientException", "NotAuthorized")


def folder(prefix: str) -> str:
    """A mounted prefix is a folder: `set` and `set/` both mean everything under `set/`."""
    return prefix.rstrip("/") + "/" if prefix.strip("/") else ""


def session_policy(bucket: str, prefix: str) -> dict[str, Any]:
    """List the folder (and its sub-folders), read the objects under it: nothing else."""
    pre = folder(prefix)
    listing: dict[str, Any] = {
        "Sid": "MountList",
        "Effect": "Allow",
        "Action": "s3:ListBucket",
        "Resource": f"arn:aws:s3:::{bucket}",
    }
    if pre:
        listing["Condition"] = {"StringLike": {"s3:prefix": [pre, f"{pre}*"]}}
    read = {
        "Sid": "MountRead",
        "Effect": "Allow",
        "Action": "s3:GetObject",
        "Resource": f"arn:aws:s3:::{bucket}/{pre}*",
    }
    return {"Version": "2012-10-17", "Statement": [listing, read]}


def token_seconds(expires: datetime, now: datetime | None = None) -> int:
    """Seconds to the deadline, within STS's bounds (a run under 15 minutes gets 15)."""
    left = (expires - (now or datetime.now(UTC))).total_seconds()
    return int(max(MIN_TOKEN_S, min(MAX_TOKEN_S, left)))


def federation_token(bucket: str, prefix: str, region: str, seconds: int, run_id: str, where: str) -> dict[str, Any]:
    """STS credentials limited to the mount's folder; UserError saying what to do when refused."""
    from botocore.exceptions import BotoCoreError, ClientError

    sts = shared_session().client("sts", region_name=region or None, config=client_config("sts"))
    try:
        got = sts.get_federation_token(
            Name=(NAME_PREFIX + run_id[-(32 - len(NAME_PREFIX)) :]).strip("-") or "gc-run",
            Policy=json.dumps(session_policy(bucket, prefix), separators=(",", ":")),
            DurationSeconds=seconds,
        )
    except ClientError as exc:
        err = exc.response.get("Error", {})
        code, text = str(err.get("Code", "")), str(err.get("Message", "")).rstrip(".")
        why = f"STS refused GetFederationToken ({code}{': ' + text if text else ''})"
        if code in REFUSED or "session" in text.lower():
            raise UserError(
                f"{where}: mode: mount needs temporary S3 credentials for the machine, and {why}.",
                hint="Run with long-term IAM user credentials allowed sts:GetFederationToken (role, SSO and "
                "other session credentials cannot call it), or use mode: copy for this input.",
            ) from None
        raise UserError(f"{where}: mode: mount: {why}.", hint="Or use mode: copy for this input.") from None
    except BotoCoreError as exc:
        raise UserError(f"{where}: mode: mount: cannot reach STS: {exc}.") from None
    return dict(got["Credentials"])


def endpoint(region: str) -> str:
    """The S3 endpoint the caller's own calls use when it is not the region's plain one: another
    store (AWS_ENDPOINT_URL, a profile's endpoint), or the dual-stack / FIPS form the user chose;
    the node must talk to the same. "" for `s3.<region>.amazonaws.com`, which rclone's AWS provider
    addresses itself (virtual-hosted, regional)."""
    url = str(s3_client(region).meta.endpoint_url or "").rstrip("/")
    return "" if url == f"https://s3.{region}.amazonaws.com" else url


def is_aws(url: str) -> bool:
    """An AWS S3 endpoint (its dual-stack and FIPS forms too), not another store's."""
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    return host.endswith(".amazonaws.com") or host.endswith(".amazonaws.com.cn")


def check_mount(bucket: str, prefix: str, where: str) -> str:
    """Before launch: the bucket (its region), objects under the folder, and that these credentials
    can get a federation token at all (one of 15 minutes, never used); the bucket's region."""
    region = check_folder(bucket, prefix, where)
    federation_token(bucket, prefix, region, MIN_TOKEN_S, "probe", where)
    return region


def check_folder(bucket: str, prefix: str, where: str) -> str:
    """The bucket (its region) and objects under the folder: all a node mounting under its own role needs."""
    region = bucket_region(bucket, where)
    pre = folder(prefix)
    page = s3_client(region).list_objects_v2(Bucket=bucket, Prefix=pre, MaxKeys=1)
    if not page.get("Contents"):
        named = s3_client(region).list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("Contents") or [{}]
        if prefix and named[0].get("Key") == prefix:
            raise UserError(
                f"{where}: s3://{bucket}/{prefix} is one object: mode: mount mounts a folder.",
                hint="Name its folder, or use mode: copy for one object.",
            )
        raise UserError(f"{where}: no objects under s3://{bucket}/{pre}.", hint="Check the prefix in the job file.")
    return region


def mount_grant(bucket: str, prefix: str, region: str, run_id: str, expires: datetime, where: str) -> dict[str, Any]:
    """What the node's rclone needs: the store, the folder and the token (secret: sealed only)."""
    creds = federation_token(bucket, prefix, region, token_seconds(expires), run_id, where)
    return {
        **node_mount(bucket, prefix, region),
        "env_auth": False,
        "access_key_id": creds["AccessKeyId"],
        "secret_access_key": creds["SecretAccessKey"],
        "session_token": creds["SessionToken"],
    }


def node_mount(bucket: str, prefix: str, region: str) -> dict[str, Any]:
    """The store and the folder; alone (`env_auth`), the node's rclone signs with its own role."""
    url = endpoint(region)
    return {
        "type": "s3",
        "provider": "Other" if url and not is_aws(url) else "AWS",  # rclone: path style at `url` when set
        "bucket": bucket,
        "prefix": folder(prefix),
        "region": region,
        "endpoint": url,
        "env_auth": True,
    }


def policy_statements(mounts: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """What the caller's IAM user needs to hand the machine its mounts (`iam-policy --data`): the
    federation token itself; the reads it delegates are the caller's own s3 statements."""
    if not mounts:
        return []
    return [
        {
            "Sid": "DataMountToken",
            "Effect": "Allow",
            "Action": "sts:GetFederationToken",
            "Resource": f"arn:aws:sts::*:federated-user/{NAME_PREFIX}*",
        }
    ]
