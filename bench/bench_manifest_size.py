"""How big is a node's manifest on S3 and Azure Blob for a 1 min and a 6 h max_duration? The VM's
upload rights must not grow with the deadline: one pre-signed URL per log part would be up to 2000,
so each node gets one log grant (S3 presigned POST on its log prefix, Azure one append blob with an
add-only SAS).

S3 runs against moto in this process (`mock_aws`), Azure against Azurite (node_modules, as the
tests use it). Prints a Markdown table: manifest bytes and the time `Channel.prepare` takes.

Usage: python bench/bench_manifest_size.py [--runs 3]. Run it with PYTHONPATH pointing at another
checkout to measure that one (the "before" figures came from commit 87f040b that way).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DURATIONS = {"1m": timedelta(minutes=1), "6h": timedelta(hours=6)}


def measure(channel: Any, label: str, runs: int) -> dict[str, tuple[float, int]]:
    """Per duration: median prepare time (s) and the manifest's bytes."""
    out = {}
    for name, duration in DURATIONS.items():
        times, size = [], 0
        for i in range(runs):
            run_id = f"bench-{label}-{name}-{i}"
            t0 = time.perf_counter()
            channel.prepare(run_id, 1, datetime.now(UTC) + duration)
            times.append(time.perf_counter() - t0)
            size = len(channel.get_bytes(f"runs/{run_id}/node-0/manifest") or b"")
        out[name] = (statistics.median(times), size)
    return out


def s3_channel() -> tuple[Any, Any]:
    import boto3
    from moto import mock_aws

    os.environ.update(
        {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    )
    mock = mock_aws()
    mock.start()
    from gpucloud.providers.aws.channel import S3Channel

    return S3Channel(boto3.Session(region_name="us-east-1"), "us-east-1", account="123456789012"), mock.stop


def blob_channel(workdir: Path) -> tuple[Any, Any]:
    from gpucloud.providers.azure.channel import BlobChannel
    from tests.support.azurite import AZURITE_KEY, start_azurite

    server = start_azurite(workdir)
    channel = BlobChannel(account_url=server.blob_endpoint, account_key=AZURITE_KEY)
    channel._ensure_container()
    return channel, server.stop


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print("| store | max_duration | manifest | `prepare` (median) |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="gpucloud-bench-") as tmp:
        for label, make in (("s3", s3_channel), ("azure", lambda: blob_channel(Path(tmp) / "azurite"))):
            channel, stop = make()
            try:
                for name, (seconds, size) in measure(channel, label, args.runs).items():
                    print(f"| {label} | {name} | {size:,} B | {seconds * 1000:.0f} ms |")
            finally:
                stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
