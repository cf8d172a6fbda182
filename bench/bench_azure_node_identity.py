"""What the Azure node identity (gpucloud/providers/azure/node_access.py) adds to a launch, a
teardown and a gc on the fake ARM server: the ARM calls and their time, median and p90 of N
grant/revoke cycles of one VM's channel role assignment.

Run: python bench/bench_azure_node_identity.py [--runs 20]   (from the repo root)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    os.environ["GPUCLOUD_HOME"] = tempfile.mkdtemp(prefix="bench-azure-identity-")
    from azure.storage.blob import BlobServiceClient  # noqa: F401  (imported before timing)

    from gpucloud.providers.azure import AzureProvider
    from gpucloud.providers.azure.node_access import grant_channel_access, listed, revoke
    from gpucloud.state.runs_db import Journal, Store
    from tests.support.azure_fixtures import OperatorCredential, launch_request
    from tests.support.azurite import start_azurite
    from tests.support.fake_arm import FakeArm

    arm = FakeArm().start()
    azurite = start_azurite(Path(tempfile.mkdtemp(prefix="bench-azurite-")))
    try:
        provider = AzureProvider(
            credential=OperatorCredential(arm),
            subscription_id=arm.subscription_id,
            arm_endpoint=arm.url,
            blob_endpoint=azurite.blob_endpoint,
        )
        journal = Journal(Store())
        provider.channel("eastus")
        run_id = "bench-20261207-000000-0000"
        provider.provision(launch_request(run_id), journal)
        vm = provider.compute.virtual_machines.get(f"gpucloud-{run_id}-eastus", "node-0")
        made: list[float] = []
        gone: list[float] = []
        calls_made = calls_gone = 0
        for _ in range(runs):
            revoke(provider, journal, run_id, "eastus")
            before = len(arm.calls)
            t0 = time.perf_counter()
            grant_channel_access(provider, journal, run_id, "eastus", vm)
            made.append(time.perf_counter() - t0)
            calls_made = len(arm.calls) - before
            before = len(arm.calls)
            t0 = time.perf_counter()
            revoke(provider, journal, run_id, "eastus")
            gone.append(time.perf_counter() - t0)
            calls_gone = len(arm.calls) - before
        before = len(arm.calls)
        t0 = time.perf_counter()
        listed(provider)
        listing = time.perf_counter() - t0
        calls_list = len(arm.calls) - before
        provider.gc(datetime.now(UTC), dry_run=True)
    finally:
        azurite.stop()
        arm.stop()
    p90 = int(0.9 * (runs - 1))
    ms = 1000
    print(
        f"launch: {calls_made} ARM call per VM, median {statistics.median(made) * ms:.0f} ms, "
        f"p90 {sorted(made)[p90] * ms:.0f} ms"
    )
    print(
        f"teardown: {calls_gone} ARM call per VM, median {statistics.median(gone) * ms:.0f} ms, "
        f"p90 {sorted(gone)[p90] * ms:.0f} ms"
    )
    print(f"gc: {calls_list} ARM call per page of role assignments, {listing * ms:.0f} ms")


if __name__ == "__main__":
    main()
