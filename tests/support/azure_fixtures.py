"""Pytest fixtures and helpers shared by the Azure tests: one fake ARM server per session (reset
for every test), Azurite, a provider wired to both, and launch requests built from real job files
through the real planner."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support.azurite import azurite  # noqa: F401  (re-exported fixture)
from tests.support.fake_arm import OPERATOR_PRINCIPAL, FakeArm


class OperatorCredential:
    """A TokenCredential that gets the operator's token from the fake ARM (in-process tests)."""

    def __init__(self, arm: FakeArm) -> None:
        self.arm = arm

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        return AccessToken(self.arm.issue_token(OPERATOR_PRINCIPAL), int(time.time()) + 3600)


def runner_role() -> dict[str, list[str]]:
    """The permissions of the role `gpucloud iam-policy azure` prints (the operator's, in tests)."""
    from gpucloud.providers.azure.rbac import role_definition

    role = role_definition("any")
    return {"actions": list(role["Actions"]), "notActions": list(role["NotActions"])}


@pytest.fixture(scope="session")
def fake_arm_server() -> Iterator[FakeArm]:
    arm = FakeArm().start()
    try:
        yield arm
    finally:
        arm.stop()


@pytest.fixture
def arm(fake_arm_server: FakeArm, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeArm]:
    """The fake ARM, empty, with the environment a CLI would use to reach it."""
    fake_arm_server.reset()
    fake_arm_server.operator_role = runner_role()  # every Azure test runs with only the printed role
    for key, value in fake_arm_server.client_env().items():
        monkeypatch.setenv(key, value)
    yield fake_arm_server
    fake_arm_server.clear_injections()


@pytest.fixture
def provider(arm: FakeArm) -> Any:
    from gpucloud.providers.azure import AzureProvider

    return AzureProvider(credential=OperatorCredential(arm), subscription_id=arm.subscription_id, arm_endpoint=arm.url)


@pytest.fixture
def journal() -> Any:
    from gpucloud.state.runs_db import Journal, Store

    return Journal(Store())


def job_yaml(*, gpu: str = "T4:1", nodes: int = 1, extra: str = "") -> str:
    return (
        f"name: unit-job\nresources:\n  cloud: azure\n  regions: [eastus]\n  gpu: {gpu}\n{extra}"
        f"num_nodes: {nodes}\nrun: echo hello\nmax_duration: 1h\n"
    )


def launch_request(
    run_id: str,
    *,
    gpu: str = "T4:1",
    nodes: int = 1,
    spot: bool = False,
    extra: str = "",
    instance_type: str | None = None,
    user_data: list[str] | None = None,
    expires_in: timedelta = timedelta(hours=2),
) -> Any:
    """A LaunchRequest from a real job file and plan (first candidate, optionally adjusted)."""
    from gpucloud.contract.provider import TAG_EXPIRES, TAG_RUN
    from gpucloud.plan.planner import make_plan
    from gpucloud.plan.requests import launch_request as narrow_request
    from gpucloud.spec.load import parse_spec

    spec = parse_spec(job_yaml(gpu=gpu, nodes=nodes, extra=extra), "job.yaml")
    plan = make_plan(spec, cloud="azure")
    cand = plan.candidates[0]
    changes: dict[str, Any] = {"spot": spot}
    if instance_type:
        changes["instance_type"] = instance_type
    cand = dataclasses.replace(cand, **changes)
    expires = datetime.now(UTC) + expires_in
    return narrow_request(
        spec,
        plan.stack,
        cand,
        run_id=run_id,
        user_data=user_data or [f"#!/bin/bash\necho node {r}\n" for r in range(nodes)],
        expires_at=expires,
        tags={TAG_RUN: run_id, TAG_EXPIRES: expires.strftime("%Y-%m-%dT%H:%M:%SZ"), "Name": f"gpucloud-{run_id}"},
    )


def run_resources(arm: FakeArm, run_id: str) -> list[dict[str, Any]]:
    """Everything of one run that exists in the fake cloud (groups being deleted count)."""
    needle = f"/resourcegroups/gpucloud-{run_id}-".lower()
    return [r for r in arm.snapshot() if needle in r["id"].lower() or r["tags"].get("gpucloud-run") == run_id]


def leftovers(arm: FakeArm) -> list[dict[str, Any]]:
    """Every tagged thing still there (the region's channel storage is not tagged and stays)."""
    return [
        r
        for r in arm.snapshot()
        if "gpucloud-run" in r["tags"]
        or (
            "/resourcegroups/gpucloud-" in r["id"].lower()
            and "/resourcegroups/gpucloud-storage-" not in r["id"].lower()
        )
    ]


def wait_until(pred: Any, timeout: float = 10.0, interval: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(interval)
    return bool(pred())


REPO = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def azure_env(
    arm: FakeArm,
    azurite: Any,
    azure_sim: Any,
    gpucloud_home: Path,
    tmp_path: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[dict[str, str]]:
    """Fake ARM + Azurite + simulator; the environment a CLI subprocess needs; cwd = tmp_path."""
    monkeypatch.setenv("GPUCLOUD_AZURE_BLOB_ENDPOINT", azurite.blob_endpoint)
    monkeypatch.chdir(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUCLOUD_TEST_"))}
    env.update(arm.client_env())
    env.update(
        {
            "GPUCLOUD_AZURE_BLOB_ENDPOINT": azurite.blob_endpoint,
            "GPUCLOUD_HOME": str(gpucloud_home),
            "CI": "true",
            "PYTHONPATH": str(REPO),
        }
    )
    yield env
    arm.clear_injections()


def finish_failed_attempt(arm: FakeArm, provider: Any, journal: Any, run_id: str) -> None:
    """A failed attempt began deleting its group and moved on: nothing of it runs any more, and the
    journal keeps the group until a teardown (the run's own, `down`, `gc`) sees it gone."""
    left = run_resources(arm, run_id)
    assert all(r["state"] == "Deleting" for r in left), left
    assert not left or journal.resources(run_id, alive_only=True)
    from gpucloud.contract.provider import RunHandle

    provider.teardown(RunHandle(run_id, "azure", "eastus", complete=False), journal, wait=True)
    assert run_resources(arm, run_id) == [], "a failed attempt leaves nothing behind"
    assert not journal.resources(run_id, alive_only=True)
