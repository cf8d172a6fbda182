"""`inputs:`/`outputs:` on S3 (docs/DATA.md): what the caller can check before launch (the bucket,
the objects under a prefix) and the grants the machine gets, each limited to what the job file
names and expiring at the run's deadline: a presigned GET per input object (read exactly those
objects, nothing else, no list, no write), one presigned POST per output prefix (`starts-with`
the prefix: write there only, no read, no list, no delete). The grants ride sealed to the node's
key (gpucloud/run/secrets.py), so a reader of user-data cannot use them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpucloud.errors import UserError
from gpucloud.providers.aws.session import client_config, shared_session

POST_MAX = 5 * 1024**3  # S3's largest single POST upload
MAX_PRESIGN_S = 7 * 24 * 3600


def s3_client(region: str | None = None) -> Any:
    """SigV4 (what every region takes, and what bounds a URL to its expiry, 7 days at most)."""
    return shared_session().client("s3", region_name=region, config=client_config("s3", signature_version="s3v4"))


def _region_header(response: dict[str, Any]) -> str:
    return str(response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("x-amz-bucket-region") or "")


def bucket_region(bucket: str, where: str) -> str:
    """The bucket's region (presigned URLs must be signed for it and name its regional host);
    UserError naming it when absent. Asked of a real region's endpoint (a region-less client is
    "aws-global", which has no FIPS form); S3 names the region in a redirect or refusal too."""
    from botocore.exceptions import BotoCoreError, ClientError

    home = shared_session().region_name or "us-east-1"
    try:
        head = s3_client(home).head_bucket(Bucket=bucket)
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("301", "307", "400", "PermanentRedirect") and _region_header(exc.response):
            return _region_header(exc.response)
        if code in ("404", "NoSuchBucket", "NotFound"):
            raise UserError(
                f"{where}: S3 bucket '{bucket}' does not exist (or is not visible to these credentials).",
                hint="Check the bucket name in the job file (s3://BUCKET/prefix).",
            ) from None
        raise UserError(
            f"{where}: cannot read S3 bucket '{bucket}' ({code or exc}).",
            hint="The caller's AWS credentials need s3:ListBucket and s3:GetObject/PutObject on it.",
        ) from None
    except BotoCoreError as exc:
        raise UserError(f"{where}: cannot reach S3 for bucket '{bucket}': {exc}.") from None
    return _region_header(head) or home


def list_input(bucket: str, prefix: str, where: str) -> tuple[str, list[tuple[str, int, str]]]:
    """(region, [(path under the input, size, key)]): one object when `prefix` names one, else
    every object under `prefix/`. No object at all is an error naming the source."""
    region = bucket_region(bucket, where)
    s3 = s3_client(region)
    if prefix and not prefix.endswith("/"):
        page = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
        first = (page.get("Contents") or [{}])[0]
        if first.get("Key") == prefix:
            return region, [("", int(first["Size"]), prefix)]
        prefix += "/"
    files = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents") or []:
            if not obj["Key"].endswith("/"):
                files.append((obj["Key"][len(prefix) :], int(obj["Size"]), obj["Key"]))
    if not files:
        raise UserError(f"{where}: no objects under s3://{bucket}/{prefix}.", hint="Check the prefix in the job file.")
    return region, files


def _expires_in(expires: datetime) -> int:
    return int(max(60, min((expires - datetime.now(UTC)).total_seconds(), MAX_PRESIGN_S)))


def input_urls(bucket: str, region: str, keys: list[str], expires: datetime) -> list[str]:
    s3 = s3_client(region)
    ttl = _expires_in(expires)
    return [s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": k}, ExpiresIn=ttl) for k in keys]


def check_output(bucket: str, where: str) -> str:
    return bucket_region(bucket, where)


def output_grant(bucket: str, region: str, prefix: str, expires: datetime) -> dict[str, Any]:
    """One presigned POST covering `prefix` (the node adds `key` per file)."""
    post = s3_client(region).generate_presigned_post(
        bucket,
        prefix + "${filename}",
        Conditions=[["starts-with", "$key", prefix], ["content-length-range", 0, POST_MAX]],
        ExpiresIn=_expires_in(expires),
    )
    fields = [[k, v] for k, v in post["fields"].items() if k != "key"]
    return {"style": "post", "url": post["url"], "fields": fields, "prefix": prefix}


def policy_statements(reads: list[tuple[str, str]], writes: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """What the caller's IAM identity needs for a job's S3 `inputs`/`outputs` (`iam-policy --data`):
    find the bucket and list the named input prefixes, read objects under them (the presigned GETs
    are the caller's), write under the output prefixes (the presigned POST is the caller's).
    Nothing else: no delete, no bucket changes, no other prefix."""
    out: list[dict[str, Any]] = []
    buckets = sorted({b for b, _ in reads + writes})
    if buckets:
        out.append(
            {
                "Sid": "DataFindBuckets",
                "Effect": "Allow",
                "Action": "s3:ListBucket",  # HeadBucket (the bucket's region) and listing the inputs
                "Resource": [f"arn:aws:s3:::{b}" for b in buckets],
            }
        )
    if reads:
        out.append(
            {
                "Sid": "DataReadInputs",
                "Effect": "Allow",
                "Action": "s3:GetObject",
                "Resource": sorted({r for b, p in reads for r in _object_arns(b, p)}),
            }
        )
    if writes:
        out.append(
            {
                "Sid": "DataWriteOutputs",
                "Effect": "Allow",
                "Action": "s3:PutObject",
                "Resource": sorted({f"arn:aws:s3:::{b}/{p.rstrip('/') + '/' if p else ''}*" for b, p in writes}),
            }
        )
    return out


def node_statements(
    reads: list[tuple[str, str]], writes: list[tuple[str, str]], mounts: list[tuple[str, str]]
) -> list[dict[str, Any]]:
    """What the node's own role needs for the job's S3 data (its inline data policy): read the named
    input objects, list only under a mounted input's folder, write only under the output prefixes.
    Less than the caller's (`policy_statements`): no HeadBucket, no listing of a copied input (the
    CLI listed it at launch), no other prefix of the same bucket."""
    out: list[dict[str, Any]] = []
    if reads:
        arns = sorted({r for b, p in reads for r in _object_arns(b, p)})
        out.append({"Sid": "NodeReadInputs", "Effect": "Allow", "Action": "s3:GetObject", "Resource": arns})
    for n, (bucket, prefix) in enumerate(sorted(set(mounts))):
        folder = prefix.rstrip("/") + "/" if prefix else ""
        listing: dict[str, Any] = {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{bucket}"}
        if prefix:  # a whole-bucket mount lists without a prefix: no condition then
            listing["Condition"] = {"StringLike": {"s3:prefix": [folder + "*", prefix]}}
        out.append({"Sid": f"NodeListMount{n}", **listing})
    if writes:
        arns = sorted({f"arn:aws:s3:::{b}/{p.rstrip('/') + '/' if p else ''}*" for b, p in writes})
        out.append({"Sid": "NodeWriteOutputs", "Effect": "Allow", "Action": "s3:PutObject", "Resource": arns})
    return out


def _object_arns(bucket: str, prefix: str) -> list[str]:
    """One object named exactly, or everything under the folder `prefix/` (not `prefix-other/`)."""
    if prefix and not prefix.endswith("/"):
        return [f"arn:aws:s3:::{bucket}/{prefix}", f"arn:aws:s3:::{bucket}/{prefix}/*"]
    return [f"arn:aws:s3:::{bucket}/{prefix}*"]
