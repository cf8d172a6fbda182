"""The AWS channel: one private S3 bucket per account and region, and presigned URLs for the VM.

Why one bucket per account+region (not per run): creating a bucket is slow and rate-limited, and a
run's objects must outlive its machines (`gpucloud logs RUN` after teardown). The bucket is made
safe once: public access blocked, SSE-S3 default encryption, and a lifecycle rule that expires
`runs/` objects after 30 days so forgotten runs cost nothing for long.

The CLI pre-signs one URL per object (SigV4, which caps a URL's life at 7 days), and the manifest
says `node_identity imds`: the node signs the same requests itself with its instance profile's
credentials (identity.py, gpucloud/vm/agent/sigv4.py), so they outlive the CLI's; the presigned
URLs are the first fetch's and the fallback's. The log is the exception:
one presigned POST per node whose policy admits any key under the node's log prefix and parts of
at most LOG_PART_MAX bytes, so the manifest does not grow with the run's length.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpucloud.channel import trust as channel_trust
from gpucloud.channel.run_objects import LOG_PART_MAX, Channel, ObjectRefused, log_prefix
from gpucloud.contract.provider import ThrottledError
from gpucloud.errors import GpucloudError
from gpucloud.providers.aws.access import permission_denied
from gpucloud.providers.aws.errors import classify, error_code, http_status
from gpucloud.providers.aws.session import retrying_call, shared_client
from gpucloud.vm.agent.sigv4 import IDENTITY_LINE

RUNS_PREFIX = "runs/"
EXPIRE_DAYS = 30
MAX_PRESIGN = timedelta(days=7)  # SigV4 presigned URLs live at most 7 days
LIFECYCLE_RULE_ID = "gpucloud-expire-runs"
CLAIMS_LISTED = 100  # keys of one `claims_get` listing (about 30 KB of XML at most)


class S3ChannelError(GpucloudError):
    """The run's bucket could not be used (permissions, a name taken by another account)."""

    exit_code = 70


def bucket_name(account: str, region: str) -> str:
    """`gpucloud-<account>-<region>`: unique per account and region, at most 9+12+1+~14 < 63 chars."""
    return f"gpucloud-{account}-{region}"


class S3Channel(Channel):
    """Channel primitives on S3 (docs/INTERNALS.md, "Channel").

    Throttling and AWS-side failures are retried (session.retrying_call); what still fails becomes a
    ProvisionError (so the lifecycle's failover and the CLI's error paragraph both understand it)."""

    RETRY_ATTEMPTS = 5
    RETRY_BASE_S = 0.5
    RETRY_CAP_S = 8.0

    def __init__(self, session: Any, region: str, *, bucket: str | None = None, account: str | None = None) -> None:
        self.session = session
        self.region = region
        # SigV4 explicitly: legacy SigV2 presigned URLs are refused in newer regions and by policies.
        self._s3 = shared_client(session, "s3", region, signature="s3v4")
        self._sts = shared_client(session, "sts", region)
        self._account = account
        self._bucket = bucket
        self._ready = False
        self._lock = threading.Lock()

    def _do(self, op: str, *, quiet: tuple[str, ...] = (), **kwargs: Any) -> Any:
        """Call an S3/STS operation through the one retrying call. Codes in `quiet` are re-raised
        as the ClientError they are (the caller expects them, e.g. NoSuchKey); anything else that
        still fails becomes a ProvisionError."""
        from botocore.exceptions import ClientError
        from botocore.exceptions import ConnectionError as BotoConnectionError

        client = self._sts if op == "get_caller_identity" else self._s3
        service = "STS" if client is self._sts else "S3"
        try:
            return retrying_call(
                client, op, attempts=self.RETRY_ATTEMPTS, base_s=self.RETRY_BASE_S, cap_s=self.RETRY_CAP_S, **kwargs
            )
        except ClientError as exc:  # credential / endpoint errors came out as CloudAccessError already
            status = http_status(exc)
            if error_code(exc) in quiet or (status is not None and str(status) in quiet):
                raise
            denied = permission_denied(exc, service=service.lower(), what=f"{service} {op}")
            if denied is not None:
                raise denied from None
            raise classify(
                exc,
                region=self.region,
                instance_type="s3",
                spot=False,
                what=f"{service} {op}",
                tries=getattr(exc, "gpucloud_tries", 1),
            ) from None
        except BotoConnectionError as exc:
            raise ThrottledError(
                f"{self.region}: could not reach {service} ({op}): {exc}", code=type(exc).__name__
            ) from None

    # ---- the bucket ---------------------------------------------------------------------------
    @property
    def account(self) -> str:
        if self._account is None:
            self._account = str(self._do("get_caller_identity")["Account"])
        return self._account

    @property
    def bucket(self) -> str:
        """The bucket name, created and configured on first use in this process."""
        self.ensure_bucket()
        assert self._bucket is not None
        return self._bucket

    def ensure_bucket(self) -> None:
        if self._ready:
            return
        with self._lock:
            if self._ready:
                return
            from botocore.exceptions import ClientError

            if self._bucket is None:
                self._bucket = bucket_name(self.account, self.region)
            name = self._bucket
            try:
                self._do(
                    "head_bucket",
                    quiet=("404", "403", "NoSuchBucket", "NotFound", "AccessDenied", "Forbidden"),
                    Bucket=name,
                    ExpectedBucketOwner=self.account,
                )
                exists = True
            except ClientError as exc:
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                code = str(exc.response.get("Error", {}).get("Code", ""))
                if status == 404 or code in {"404", "NoSuchBucket", "NotFound"}:
                    exists = False
                elif status == 403 or code in {"403", "AccessDenied", "Forbidden"}:
                    raise S3ChannelError(
                        f"S3 bucket {name} exists but this account ({self.account}) cannot use it: "
                        "another account may own the name, or the credentials lack s3:ListBucket.",
                        hint="Check the credentials with `gpucloud iam-policy aws` (the policy gpucloud needs).",
                    ) from None
                else:
                    raise
            if not exists:
                self._create(name)
            self._configure(name)
            self._ready = True

    def _create(self, name: str) -> None:
        from botocore.exceptions import ClientError

        kwargs: dict[str, Any] = {"Bucket": name}  # ACLs are disabled by default on new buckets
        if self.region != "us-east-1":  # us-east-1 refuses an explicit LocationConstraint of itself
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        try:
            self._do("create_bucket", quiet=("BucketAlreadyOwnedByYou", "BucketAlreadyExists"), **kwargs)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code == "BucketAlreadyOwnedByYou":
                return  # another gpucloud process won the race
            if code == "BucketAlreadyExists":
                raise S3ChannelError(
                    f"S3 bucket name {name} is taken by another AWS account.",
                    hint="Bucket names are global; ask the owner or contact AWS support.",
                ) from None
            raise

    def _configure(self, name: str) -> None:
        """Idempotent: a crash between create and configure must not leave an open bucket."""
        self._do(
            "put_public_access_block",
            Bucket=name,
            PublicAccessBlockConfiguration={
                "BlockPublicAcls": True,
                "IgnorePublicAcls": True,
                "BlockPublicPolicy": True,
                "RestrictPublicBuckets": True,
            },
        )
        self._do(
            "put_bucket_encryption",
            Bucket=name,
            ServerSideEncryptionConfiguration={
                "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}, "BucketKeyEnabled": True}],
            },
        )
        self._do(
            "put_bucket_lifecycle_configuration",
            Bucket=name,
            LifecycleConfiguration={
                "Rules": [
                    {
                        "ID": LIFECYCLE_RULE_ID,
                        "Status": "Enabled",
                        "Filter": {"Prefix": RUNS_PREFIX},
                        "Expiration": {"Days": EXPIRE_DAYS},
                        "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1},
                    }
                ]
            },
        )

    # ---- primitives ---------------------------------------------------------------------------
    def put_bytes(self, key: str, data: bytes) -> None:
        self._do("put_object", Bucket=self.bucket, Key=key, Body=data, ExpectedBucketOwner=self.account)

    def put_file(self, key: str, path: Path) -> None:
        """Small files in one PUT (retried like every call); large code tarballs in parts."""
        path = Path(path)
        if path.stat().st_size <= 64 * 1024 * 1024:
            self.put_bytes(key, path.read_bytes())
            return
        self._s3.upload_file(str(path), self.bucket, key, ExtraArgs={"ExpectedBucketOwner": self.account})

    def _get_object(self, key: str) -> Any:
        """GET's response (its Body unread), or None where there is no such object."""
        from botocore.exceptions import ClientError

        missing = ("NoSuchKey", "404", "NotFound")
        try:
            return self._do("get_object", quiet=missing, Bucket=self.bucket, Key=key, ExpectedBucketOwner=self.account)
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code", "")) in missing:
                return None
            raise

    def get_bytes(self, key: str, limit: int | None = None) -> bytes | None:
        """GET; with `limit`, an object larger than that is refused on its ContentLength, unread."""
        obj = self._get_object(key)
        if obj is None:
            return None
        if limit is not None and int(obj.get("ContentLength") or 0) > limit:
            obj["Body"].close()
            raise ObjectRefused(f"{key} is larger than its cap of {limit} bytes ({obj['ContentLength']} bytes)")
        return obj["Body"].read() if limit is None else obj["Body"].read(limit + 1)[: limit + 1]

    def get_to_file(self, key: str, path: Path) -> bool:
        """Stream the object to disk in 1 MiB chunks (an artifacts tarball may be many GB)."""
        obj = self._get_object(key)
        if obj is None:
            return False
        with open(path, "wb") as out:
            out.writelines(obj["Body"].iter_chunks(1024 * 1024))
        return True

    def _expires_in(self, expires: datetime) -> int:
        if expires.tzinfo is None:
            expires = expires.replace(tzinfo=UTC)
        seconds = (expires - datetime.now(UTC)).total_seconds()
        return int(max(60, min(seconds, MAX_PRESIGN.total_seconds())))

    def url_get(self, key: str, expires: datetime) -> str:
        return self._s3.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=self._expires_in(expires)
        )

    def url_put(self, key: str, expires: datetime) -> str:
        return self._s3.generate_presigned_url(
            "put_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=self._expires_in(expires)
        )

    def log_grant(self, run_id: str, rank: int, expires: datetime) -> list[str]:
        """One presigned POST for the node's whole log (S3 POST policy: `starts-with $key` the
        node's log prefix, `content-length-range` 0..LOG_PART_MAX, the bucket, the signing fields;
        docs/INTERNALS.md, "Channel"). The VM adds the `key` field per part and the file last."""
        prefix = log_prefix(run_id, rank)
        post = self._s3.generate_presigned_post(
            self.bucket,
            prefix + "${filename}",
            Conditions=[["content-length-range", 0, LOG_PART_MAX]],
            ExpiresIn=self._expires_in(expires),
        )
        fields = {name: value for name, value in post["fields"].items() if name != "key"}
        return [
            IDENTITY_LINE,  # the node signs with its own role (identity.py); these URLs are its fallback
            f"log_post {post['url']}",
            f"log_post_key {prefix}",
            *(f"log_post_field {name} {value}" for name, value in fields.items()),
        ]

    signs = True

    def claims(self, run_id: str, rank: int) -> list[tuple[str | None, bytes]]:
        """Objects `<log prefix>claim-<fingerprint>` (the log POST grant admits any key under the
        prefix, so a claim can be added but the CLI sees every one); at most 100, each capped."""
        prefix = log_prefix(run_id, rank) + channel_trust.CLAIM_PREFIX
        page = self._do(
            "list_objects_v2", Bucket=self.bucket, Prefix=prefix, MaxKeys=100, ExpectedBucketOwner=self.account
        )
        out: list[tuple[str | None, bytes]] = []
        for obj in page.get("Contents", []):
            data = self.get_bytes(obj["Key"], limit=channel_trust.CLAIM_MAX)
            if data is not None:
                out.append((obj["Key"][len(prefix) :], data))
        return out

    def claims_url(self, run_id: str, rank: int, expires: datetime) -> str | None:
        """A presigned ListObjectsV2 of the node's claim objects only (the prefix is signed): the
        answer's XML names each `claim-<fingerprint>`. The log grant can add any key under the prefix,
        so junk keys could push a claim off a short page: the node refuses a truncated one."""
        return str(
            self._s3.generate_presigned_url(
                "list_objects_v2",
                Params={
                    "Bucket": self.bucket,
                    "Prefix": log_prefix(run_id, rank) + channel_trust.CLAIM_PREFIX,
                    "MaxKeys": CLAIMS_LISTED,
                },
                ExpiresIn=self._expires_in(expires),
            )
        )

    def delete_prefix(self, prefix: str) -> None:
        paginator = self._s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix, ExpectedBucketOwner=self.account):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            for i in range(0, len(keys), 1000):
                self._do(
                    "delete_objects",
                    Bucket=self.bucket,
                    Delete={"Objects": keys[i : i + 1000], "Quiet": True},
                    ExpectedBucketOwner=self.account,
                )
