"""User-data size for every example on every provider: what a VM is sent is the shim
(templates/shim.sh.j2), with the provider's real manifest URL shape (a presigned S3 GET with a
session token, an Azure SAS URL, a file:// path), raw and gzip'd bytes, and base64 (how Azure counts).

    python bench/bench_userdata_size.py

URLs are made offline with fake credentials (no network), signed as the channels sign them: S3 with
S3Channel's client config (SigV4), Azure by BlobChannel.url_get itself (start time, https only).
"""

from __future__ import annotations

import base64
import gzip
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpucloud.contract.registry import capabilities  # noqa: E402
from gpucloud.spec.load import load_spec  # noqa: E402
from gpucloud.vm.shim import SHIM_TARGET_BYTES, render_shim  # noqa: E402

RUN = "t4job-20261205-081500-ab12"
KEY = f"runs/{RUN}/node-0/manifest"
# An STS session token is ~700-1100 characters; take the long end.
SESSION_TOKEN = "IQoJb3JpZ2luX2VjE" + "A" * 1100


def s3_url() -> str:
    import boto3

    from gpucloud.providers.aws.session import client_config

    s3 = boto3.client(
        "s3",
        region_name="us-east-1",
        aws_access_key_id="ASIAEXAMPLEEXAMPLE00",
        aws_secret_access_key="x" * 40,
        aws_session_token=SESSION_TOKEN,
        config=client_config("s3", signature_version="s3v4"),  # S3Channel's client: SigV4, not boto3's SigV2 default
    )
    return str(
        s3.generate_presigned_url(
            "get_object", Params={"Bucket": "gpucloud-123456789012-us-east-1", "Key": KEY}, ExpiresIn=7 * 86400
        )
    )


def azure_url() -> str:
    from gpucloud.providers.azure.channel import BlobChannel

    channel = BlobChannel(
        account_url="https://gpucloud0123456789abcdef.blob.core.windows.net",
        account_key=base64.b64encode(b"k" * 64).decode(),
    )
    return channel.url_get(KEY, datetime.now(UTC) + timedelta(days=7))


def main() -> None:
    urls = {
        "aws": s3_url(),
        "azure": azure_url(),
        "local": f"file:///home/someone/.local/share/gpucloud/channel/{KEY}",
        "ssh": f"file:///home/someone/.gpucloud/channel/{KEY}",
    }
    head = f"{'example':<22} {'cloud':<6} {'raw B':>6} {'gzip B':>7} {'base64 B':>9}"
    print(f"{head}  (target raw <= {SHIM_TARGET_BYTES})")
    worst = 0
    for example in sorted((REPO / "examples").glob("*.yaml")):
        spec = load_spec(example)
        for cloud, url in urls.items():
            for rank in (0, None) if cloud == "aws" else (0,):
                text = render_shim(
                    caps=capabilities(cloud),
                    run_id=RUN,
                    max_duration=int(spec.max_duration),
                    agent_sha256="0" * 64,
                    manifest_url=url,
                    node_rank=rank,
                ).encode()
                worst = max(worst, len(text))
                label = cloud if rank is not None else "aws*"
                packed = gzip.compress(text, compresslevel=9, mtime=0)
                b64 = len(base64.b64encode(text))
                print(f"{example.name:<22} {label:<6} {len(text):>6,} {len(packed):>7,} {b64:>9,}")
    print(f"largest: {worst:,} B raw (aws* = one shared user-data for every node)")


if __name__ == "__main__":
    main()
