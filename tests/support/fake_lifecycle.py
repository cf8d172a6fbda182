"""A lifecycle run without a cloud: a provider that records its calls and fails each provision with
the error queued for its region and type, a priced candidate, and a one-node run on that provider."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from gpucloud.channel.run_objects import FileChannel
from gpucloud.contract import registry as providers
from gpucloud.contract.provider import (
    Candidate,
    Capabilities,
    RunHandle,
)
from gpucloud.plan.planner import Plan
from gpucloud.run import lifecycle
from gpucloud.spec.load import parse_spec
from gpucloud.state.runs_db import Journal


class RecordingProvider:
    """Records calls; fails each provision with the error queued for its region/type."""

    capabilities = Capabilities(poll_interval=0.05)

    def __init__(self, name: str, errors: dict[str, Exception], calls: list[str], home: Path) -> None:
        self.name, self.errors, self.calls, self.home = name, errors, calls, home
        self.handles: list[RunHandle] = []  # what provision returned
        self.torn: list[RunHandle] = []  # what teardown was given

    def channel(self, region: str) -> FileChannel:
        return FileChannel(self.home / "channel" / self.name / region)

    def provision(self, req, journal: Journal) -> RunHandle:  # type: ignore[no-untyped-def]
        key = f"{req.region}/{req.instance_type}"
        self.calls.append(f"provision {self.name}/{key}")
        res = journal.intent(req.run_id, "instance", key, req.region, self.name)
        err = self.errors.get(key)
        if err:
            raise err
        journal.created(res, "id-1")
        self.handles.append(RunHandle(req.run_id, self.name, req.region, attempt=req.attempt, nodes=["id-1"]))
        return self.handles[-1]

    def master_port(self) -> int:
        return 29500

    def console_hint(self, handle: RunHandle, rank: int) -> str:
        return ""

    def node_states(self, handle: RunHandle) -> list[str]:
        return ["running"]

    def teardown(self, handle: RunHandle, journal: Journal, *, wait: bool = True) -> None:
        self.calls.append(f"teardown {self.name}/{handle.region}")
        self.torn.append(handle)
        for res in journal.resources(handle.run_id):
            if res.cloud == self.name and res.region == handle.region:
                journal.deleted(res.id)

    def gc(self, now: datetime, *, dry_run: bool) -> list[str]:
        return []


def priced_candidate(cloud: str, region: str, itype: str, price: float) -> Candidate:
    """One on-demand T4 node at `price` per hour."""
    return Candidate(
        cloud=cloud,
        region=region,
        instance_type=itype,
        gpu="T4",
        gpu_count=1,
        num_nodes=1,
        spot=False,
        price_per_hour=price,
        total_per_hour=price,
        estimated_cost=price,
    )


def fake_run(workdir: Path, home: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A lifecycle run of a one-node job on a RecordingProvider (whose VM never reports): the run, the
    provider's call list and the provider."""
    from gpucloud.plan.stacks import resolve_stack

    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "job.yaml").write_text("name: intr\nrun: 'true'\nresources: {gpu: T4:1}\n")
    spec = parse_spec((workdir / "job.yaml").read_text(), str(workdir / "job.yaml"))
    spec.source = workdir / "job.yaml"
    calls: list[str] = []
    prov = RecordingProvider("aws", {}, calls, home)
    monkeypatch.setattr(providers, "get_provider", lambda cloud, **kw: prov)
    plan = Plan(
        spec=spec,
        excluded=[],
        stack=resolve_stack("T4", spec.stack),
        candidates=[priced_candidate("aws", "us-east-1", "g4dn.xlarge", 0.5)],
    )
    return (
        lifecycle.RunInProgress(spec, plan, detach=False, json_out=False, wait_teardown=True, plan_s=0.0),
        calls,
        prov,
    )
