"""Provisioning API calls and wall time for N = 1, 4 and 16 nodes on the cloud simulators.

Provisioning only: `provider.provision` then `provider.teardown` (wait=True) through the provider
API with a Journal, no job runs and no VM boots, so N = 16 is cheap.

- Azure, against the fake ARM server (tests/support/fake_arm.py): ARM PUTs (what ARM bills against
  its write limits) and all HTTP requests (polls of long-running operations and the teardown
  included). ARM has no call that creates N VMs (short of a scale set): per node one public IP,
  one NIC, one VM and one role assignment, created in parallel; the shared resource group, NSG,
  VNet and proximity placement group once. PUTs = 3 + 4N (+1 placement group when N > 1).
- AWS, against moto (tests/support/moto_server.py): RunInstances and DescribeInstances, and all
  EC2 calls, counted with botocore's before-call event on the session given to AwsProvider (the
  test hooks of tests/support/aws_faults.py, which also answer the placement-group calls moto
  lacks). N nodes are one RunInstances call (MinCount = MaxCount = N) into a cluster placement
  group: 1 call whatever N; the placement group adds Create/Describe/Delete once when N > 1.

Usage: python bench/bench_provision_calls.py [--nodes 1 4 16] [--repeat 3] [--cloud azure aws]
Prints one table; the wall time is the median of --repeat provision+teardown cycles.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import statistics
import sys
import tempfile
import time
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


@dataclasses.dataclass
class Row:
    cloud: str
    nodes: int
    counts: dict[str, int]  # call name -> count, for one provision + teardown
    provision_s: float  # median
    teardown_s: float  # median
    note: str = ""


def _job(cloud: str, nodes: int, region: str) -> str:
    return (
        f"name: bench-nodes\nresources:\n  cloud: {cloud}\n  regions: [{region}]\n  gpu: T4:1\n"
        f"num_nodes: {nodes}\nrun: echo hi\nmax_duration: 1h\n"
    )


def _request(cloud: str, nodes: int, region: str, run_id: str, *, shared: bool) -> Any:
    """A LaunchRequest from a real job file and the real planner (first candidate)."""
    from gpucloud.contract.provider import TAG_EXPIRES, TAG_RUN
    from gpucloud.plan.planner import make_plan
    from gpucloud.plan.requests import launch_request
    from gpucloud.spec.load import parse_spec

    spec = parse_spec(_job(cloud, nodes, region), "bench.yaml")
    plan = make_plan(spec, cloud=cloud)
    cand = dataclasses.replace(plan.candidates[0], spot=False)
    expires = datetime.now(UTC) + timedelta(hours=2)
    scripts = (
        ["#!/bin/bash\necho shared\n"] * nodes if shared else [f"#!/bin/bash\necho node {r}\n" for r in range(nodes)]
    )
    return launch_request(
        spec,
        plan.stack,
        cand,
        run_id=run_id,
        user_data=scripts,
        expires_at=expires,
        tags={TAG_RUN: run_id, TAG_EXPIRES: expires.strftime("%Y-%m-%dT%H:%M:%SZ"), "Name": f"gpucloud-{run_id}"},
    )


# ---- Azure ---------------------------------------------------------------------------------------


def bench_azure(node_counts: list[int], repeat: int) -> list[Row]:
    from gpucloud.providers.azure import AzureProvider
    from gpucloud.state.runs_db import Journal, Store
    from tests.support.azure_fixtures import OperatorCredential
    from tests.support.fake_arm import FakeArm

    rows = []
    with FakeArm() as arm:
        provider = AzureProvider(
            credential=OperatorCredential(arm), subscription_id=arm.subscription_id, arm_endpoint=arm.url
        )
        journal = Journal(Store())
        warm = provider.provision(
            _request("azure", 1, "eastus", "bench-warmup", shared=False), journal
        )  # imports, clients
        provider.teardown(warm, journal)
        for n in node_counts:
            prov_s, down_s, counts = [], [], {}
            for i in range(repeat):
                arm.reset()
                run_id = f"bench-az-{n}-{i}"
                req = _request("azure", n, "eastus", run_id, shared=False)
                t0 = time.perf_counter()
                handle = provider.provision(req, journal)
                t1 = time.perf_counter()
                assert len(handle.nodes) == n
                with arm.lock:
                    calls = list(arm.calls)
                    prov_requests = arm.requests
                provider.teardown(handle, journal, wait=True)
                t2 = time.perf_counter()
                prov_s.append(t1 - t0)
                down_s.append(t2 - t1)
                leftover = [r for r in arm.snapshot() if f"gpucloud-{run_id}-" in r["id"]]
                assert not leftover, leftover
                puts = [p for m, p, _ in calls if m == "PUT"]
                with arm.lock:
                    total = arm.requests
                counts = {
                    "ARM PUT": len(puts),
                    "  VM PUT": sum("/virtualmachines/" in p.lower() for p in puts),
                    "  PPG PUT": sum("/proximityplacementgroups/" in p.lower() for p in puts),
                    "ARM requests (provision)": prov_requests,
                    "ARM requests (total)": total,
                }
            rows.append(
                Row(
                    "azure",
                    n,
                    counts,
                    statistics.median(prov_s),
                    statistics.median(down_s),
                    note=f"fake ARM, LRO {arm.op_seconds * 1000:.0f} ms",
                )
            )
    return rows


# ---- AWS -----------------------------------------------------------------------------------------


def bench_aws(node_counts: list[int], repeat: int) -> list[Row]:
    """AwsProvider.provision against a ThreadedMotoServer; EC2 calls counted on the session."""
    from gpucloud.providers.aws import AwsProvider
    from gpucloud.state.runs_db import Journal, Store
    from tests.support.aws_faults import AwsHooks
    from tests.support.moto_server import DEFAULT_REGION, start_moto

    moto = start_moto()
    os.environ.update(moto.env)
    hooks = AwsHooks(idempotency=False)
    hooks.attach(moto.session)  # before the provider makes its clients: they copy the session's handlers

    def ec2_calls() -> collections.Counter[str]:
        return collections.Counter(c.operation for c in list(hooks.calls) if c.service == "ec2")

    provider = AwsProvider(session=moto.session, poll_s=0.05, retry_base_s=0.05)
    shared = provider.capabilities.shared_user_data
    journal = Journal(Store())
    rows = []
    for n in node_counts:
        prov_s, down_s, counts = [], [], {}
        for i in range(repeat):
            run_id = f"bench-aws-{n}-{i}-{int(time.time())}"
            req = _request("aws", n, DEFAULT_REGION, run_id, shared=shared)
            hooks.calls.clear()
            t0 = time.perf_counter()
            handle = provider.provision(req, journal)
            t1 = time.perf_counter()
            prov_calls = dict(ec2_calls())
            assert len(handle.nodes) == n
            provider.teardown(handle, journal, wait=True)
            t2 = time.perf_counter()
            prov_s.append(t1 - t0)
            down_s.append(t2 - t1)
            calls = ec2_calls()
            counts = {
                "RunInstances": prov_calls.get("RunInstances", 0),
                "DescribeInstances": prov_calls.get("DescribeInstances", 0),
                "placement-group calls": sum(v for k, v in calls.items() if "PlacementGroup" in k),
                "EC2 calls (provision)": sum(prov_calls.values()),
                "EC2 calls (total)": sum(calls.values()),
            }
        rows.append(
            Row(
                "aws",
                n,
                counts,
                statistics.median(prov_s),
                statistics.median(down_s),
                note=f"moto, shared_user_data={shared}",
            )
        )
    return rows


# ---- report --------------------------------------------------------------------------------------


def print_table(rows: list[Row]) -> None:
    for cloud in dict.fromkeys(r.cloud for r in rows):
        mine = [r for r in rows if r.cloud == cloud]
        names = list(dict.fromkeys(k for r in mine for k in r.counts))
        head = ["N", *names, "provision s", "teardown s"]
        table = [
            [str(r.nodes), *(str(r.counts.get(k, "")) for k in names), f"{r.provision_s:.2f}", f"{r.teardown_s:.2f}"]
            for r in mine
        ]
        widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(head)]
        print(f"\n{cloud} ({mine[0].note})")
        print("| " + " | ".join(h.strip().ljust(w) for h, w in zip(head, widths, strict=True)) + " |")
        print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
        for t in table:
            print("| " + " | ".join(c.rjust(w) for c, w in zip(t, widths, strict=True)) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cloud", nargs="+", default=["azure", "aws"], choices=["azure", "aws"])
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    home = tempfile.mkdtemp(prefix="gpucloud-bench-")
    os.environ["GPUCLOUD_HOME"] = home
    os.environ["CI"] = "true"
    rows: list[Row] = []
    if "azure" in args.cloud:
        rows += bench_azure(args.nodes, args.repeat)
    if "aws" in args.cloud:
        try:
            rows += bench_aws(args.nodes, args.repeat)
        except Exception as exc:  # the AWS provider is still being finished: report, don't hide Azure
            print(f"aws: not measurable yet: {type(exc).__name__}: {exc}", file=sys.stderr)
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
