"""Sovereign clouds: a run whose CLI is configured for Azure US Government (its sign-in host, or
the Azure CLI's current cloud) talks to that cloud's ARM, and its nodes' self-delete does too:
the job config carries the ARM endpoint and token audience, and the node asks IMDS for a token
of that audience and sends the DELETE there (not to management.azure.com)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpucloud.providers.azure import AzureProvider
from gpucloud.vm.agent.config import JobConfig
from gpucloud.vm.agent.hooks import hooks_for
from tests.support.agent_fakes import FakeClock, FakeTransfer

GOV_ARM = "https://management.usgovcloudapi.net"
IMDS = "http://imds.test"


@pytest.fixture
def clean_cloud_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No ARM override, no sign-in host, an empty Azure CLI config folder."""
    for name in ("GPUCLOUD_AZURE_ARM_ENDPOINT", "AZURE_AUTHORITY_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(tmp_path))
    return tmp_path


def node_config(provider: AzureProvider) -> JobConfig:
    """The job config a run of this provider gives its nodes, read back as the node reads it."""
    from gpucloud.plan.planner import make_plan
    from gpucloud.spec.load import parse_spec
    from gpucloud.vm.agent_config import job_config

    spec = parse_spec(
        "name: j\nresources:\n  cloud: azure\n  regions: [eastus]\n  gpu: T4:1\nrun: echo hi\nmax_duration: 1h\n",
        "job.yaml",
    )
    plan = make_plan(spec, cloud="azure")
    cfg = job_config(spec, plan.stack, plan.candidates[0], caps=provider.capabilities, run_id="run-gov")
    return JobConfig.from_mapping(json.loads(cfg.to_json()))


def self_delete_calls(cfg: JobConfig) -> list[tuple[str, str]]:
    """What the node's self-delete asks IMDS and ARM for, under this config."""
    transfer = FakeTransfer()
    calls: list[tuple[str, str]] = []

    def request(method: str, url: str, headers: Any = (), *, max_time: float = 20) -> bytes | None:
        calls.append((method, url))
        if "/identity/oauth2/token" in url:
            return b'{"access_token": "T"}'
        if "/metadata/instance/compute" in url:
            return b'{"subscriptionId": "S", "resourceGroupName": "G", "resourceId": "/subscriptions/S/vm/V"}'
        return b""

    transfer.request = request  # type: ignore[method-assign]
    env = {"GPUCLOUD_IMDS_ENDPOINT": IMDS}
    hooks = hooks_for(
        cfg.self_termination, cfg.preemption_notice, transfer, env, print, FakeClock().sleep, endpoints=cfg.endpoints
    )
    assert hooks.delete_self() is True  # type: ignore[attr-defined]
    return calls


@pytest.mark.parametrize("how", ["authority", "az-cli"])
def test_a_us_government_run_gives_its_nodes_that_arm_and_audience(
    clean_cloud_env: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    if how == "authority":
        monkeypatch.setenv("AZURE_AUTHORITY_HOST", "https://login.microsoftonline.us")
    else:
        (clean_cloud_env / "config").write_text("[cloud]\nname = AzureUSGovernment\n", encoding="utf-8")
    provider = AzureProvider(credential=object(), subscription_id="S")
    assert provider.arm_endpoint == GOV_ARM
    cfg = node_config(provider)
    assert cfg.endpoints == {"arm": GOV_ARM, "arm_audience": f"{GOV_ARM}/"}
    calls = self_delete_calls(cfg)
    token = [u for m, u in calls if "oauth2/token" in u]
    assert token == [f"{IMDS}/metadata/identity/oauth2/token?api-version=2018-02-01&resource={GOV_ARM}/"]
    deletes = [u for m, u in calls if m == "DELETE"]
    assert deletes == [f"{GOV_ARM}/subscriptions/S/resourcegroups/G?api-version=2021-04-01"]
    assert not any("management.azure.com" in u for _, u in calls)


def test_the_public_cloud_stays_the_default(clean_cloud_env: Path) -> None:
    provider = AzureProvider(credential=object(), subscription_id="S")
    assert provider.arm_endpoint == "https://management.azure.com"
    calls = self_delete_calls(node_config(provider))
    assert any(u.endswith("resource=https://management.azure.com/") for _, u in calls)
    assert [u for m, u in calls if m == "DELETE"][0].startswith("https://management.azure.com/subscriptions/S/")


def test_a_config_without_endpoints_keeps_the_public_audience(clean_cloud_env: Path) -> None:
    """A job config written by an older CLI (no endpoints): the node's defaults, as before."""
    cfg = JobConfig.from_mapping({"run_id": "r", "self_termination": "azure-delete"})
    assert cfg.endpoints == {}
    calls = self_delete_calls(cfg)
    assert any(u.endswith("resource=https://management.azure.com/") for _, u in calls)


def test_the_arm_override_wins_over_the_configured_cloud(
    clean_cloud_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (clean_cloud_env / "config").write_text("[cloud]\nname = AzureChinaCloud\n", encoding="utf-8")
    assert AzureProvider(credential=object(), subscription_id="S").arm_endpoint == "https://management.chinacloudapi.cn"
    monkeypatch.setenv("GPUCLOUD_AZURE_ARM_ENDPOINT", "http://127.0.0.1:9/")
    provider = AzureProvider(credential=object(), subscription_id="S")
    assert provider.arm_endpoint == "http://127.0.0.1:9"
    assert dict(provider.capabilities.node_endpoints)["arm_audience"] == "http://127.0.0.1:9/"
