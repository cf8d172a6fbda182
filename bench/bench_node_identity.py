"""What the AWS node identity (gpucloud/providers/aws/identity.py) adds to a launch and a teardown
on moto in server mode: the IAM calls and their time, median and p90 of N create/delete cycles.

Run: python bench/bench_node_identity.py [--runs 20]   (from the repo root)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class _Journal:
    def intent(self, *args: object) -> int:
        return 1

    def created(self, *args: object) -> None:
        pass

    def deleted(self, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    from tests.support.moto_server import start_moto

    moto = start_moto()
    os.environ.update(moto.env)
    from gpucloud.contract.provider import RunHandle
    from gpucloud.providers.aws import AwsProvider
    from gpucloud.providers.aws.identity import create_identity, delete_identity
    from tests.support.aws_requests import make_request

    provider = AwsProvider(retry_base_s=0.01, sleep=lambda s: None)
    bucket = provider.channel("us-east-1").bucket
    made: list[float] = []
    gone: list[float] = []
    for i in range(runs):
        req = make_request(attempt=i)
        handle = RunHandle(run_id=req.run_id, cloud="aws", region="us-east-1", attempt=i)
        t0 = time.perf_counter()
        name = create_identity(provider, req, _Journal(), handle, bucket)  # type: ignore[arg-type]
        made.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        delete_identity(provider, "us-east-1", name)
        gone.append(time.perf_counter() - t0)
    p90 = int(0.9 * (runs - 1))
    print(f"launch: 4 IAM calls, median {statistics.median(made) * 1000:.0f} ms, p90 {sorted(made)[p90] * 1000:.0f} ms")
    print(
        f"teardown: 4 IAM calls, median {statistics.median(gone) * 1000:.0f} ms, p90 {sorted(gone)[p90] * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
