"""`gc` on Azure reports per call: a page of the resource-group listing or a group's DELETE that
fails is named with its RBAC action and scope, what the other calls found still counts, and the
sweep ends "in part" with exit 75 (it was exit 78 and nothing found, or a failed delete that still
exited 0). The fake ARM pages its listing (`page_size`) as ARM does, with `nextLink`."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpucloud.contract.provider import TAG_EXPIRES, TAG_RUN
from gpucloud.contract.tags import GcIncomplete
from tests.support.azure_fixtures import arm, fake_arm_server, provider  # noqa: F401  (fixtures)
from tests.support.cli import cli
from tests.support.fake_arm import FakeArm

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning")]
REPO = Path(__file__).resolve().parents[3]


def _expired_groups(provider: Any, *runs: str) -> None:  # noqa: F811
    past = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for run in runs:
        provider.resource.resource_groups.create_or_update(
            f"gpucloud-{run}-eastus", {"location": "eastus", "tags": {TAG_RUN: run, TAG_EXPIRES: past}}
        )


def test_a_page_that_fails_is_named_and_the_other_pages_finds_count(arm: FakeArm, provider: Any) -> None:  # noqa: F811
    _expired_groups(provider, "gc-a", "gc-b")
    arm.page_size = 1
    arm.inject("GET", r"/resourcegroups$", code="InternalServerError", query=r"skiptoken=1", times=20)
    with pytest.raises(GcIncomplete) as exc:
        provider.gc(datetime.now(UTC), dry_run=True)
    assert [line for line in exc.value.lines if line.startswith("would delete")] == [
        next(line for line in exc.value.lines if "gc-a" in line)
    ]
    (failure,) = exc.value.failures
    assert "listing resource groups (page 2; Microsoft.Resources/subscriptions/resourceGroups/read" in failure
    assert f"over /subscriptions/{arm.subscription_id})" in failure and "InternalServerError" in failure


def test_a_delete_that_fails_is_named_and_the_others_are_deleted(arm: FakeArm, provider: Any) -> None:  # noqa: F811
    _expired_groups(provider, "gc-c", "gc-d")
    arm.inject("DELETE", r"/resourcegroups/gpucloud-gc-c-eastus$", code="InternalServerError", times=20)
    with pytest.raises(GcIncomplete) as exc:
        provider.gc(datetime.now(UTC), dry_run=False)
    assert any(line.startswith("deleted") and "gc-d" in line for line in exc.value.lines)
    (failure,) = exc.value.failures
    assert "deleting azure/eastus/resource-group/gpucloud-gc-c-eastus" in failure
    assert "Microsoft.Resources/subscriptions/resourceGroups/delete over" in failure and "still there" in failure
    names = [r["id"].rsplit("/", 1)[-1] for r in arm.snapshot()]
    assert "gpucloud-gc-c-eastus" in names and "gpucloud-gc-d-eastus" not in names


def test_gc_dry_run_exits_75_with_azure_in_part(arm: FakeArm, provider: Any, gpucloud_home: Path) -> None:  # noqa: F811
    _expired_groups(provider, "gc-e", "gc-f")
    arm.page_size = 1
    arm.inject("GET", r"/resourcegroups$", code="InternalServerError", query=r"skiptoken=1", times=20)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUCLOUD_TEST_"))}
    env.update({**arm.client_env(), "GPUCLOUD_HOME": str(gpucloud_home), "PYTHONPATH": str(REPO)})
    out = cli("gc", "--dry-run", "--cloud", "azure", env=env, timeout=120)
    text = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 75, text[-2000:]
    assert "in part: azure" in text and "gc-e" in text and "listing resource groups (page 2;" in text, text[-2000:]
