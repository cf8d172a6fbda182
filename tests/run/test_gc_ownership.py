"""Cloud `gc` acts only on resources whose gpucloud tags are exactly as gpucloud writes them: a
malformed or hostile `gpucloud-run` / `gpucloud-expires` (anyone with tag rights in the account
can write one) is named and never deleted, and never a traceback; and `gc` exits 75 when a
provider found something of its own that it could not cancel or remove."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpucloud.contract.provider import TAG_EXPIRES, TAG_RUN, expiry_tag
from gpucloud.contract.tags import GcIncomplete, tagged_expiry
from tests.support.azure_fixtures import arm, fake_arm_server, journal, provider  # noqa: F401  (fixtures)
from tests.support.moto_server import moto, moto_server  # noqa: F401  (fixtures)

OLD = "2020-01-01T00:00:00Z"
HOSTILE = [
    ({TAG_RUN: "../../precious", TAG_EXPIRES: OLD}, "gpucloud-run tag (../../precious) is not a run id"),
    ({TAG_RUN: "run\x1b]0;pwned\x07", TAG_EXPIRES: OLD}, "gpucloud-run tag (run\\x1b]0;pwned\\x07) is not a run id"),
    ({TAG_RUN: "", TAG_EXPIRES: OLD}, "gpucloud-run tag () is not a run id"),
    ({TAG_RUN: "a run", TAG_EXPIRES: OLD}, "gpucloud-run tag (a run) is not a run id"),
    ({TAG_EXPIRES: OLD}, "gpucloud-run tag (None) is not a run id"),
    ({TAG_RUN: "stray", TAG_EXPIRES: "2020-01-01"}, "gpucloud-expires tag (2020-01-01) is not a time"),
    ({TAG_RUN: "stray", TAG_EXPIRES: "2020-01-01T00:00:00+00:00"}, "is not a time as gpucloud writes it"),
    ({TAG_RUN: "stray", TAG_EXPIRES: "\n::error::x"}, "gpucloud-expires tag (\\x0a::error::x) is not a time"),
]


def test_tags_are_read_strictly() -> None:
    assert tagged_expiry({TAG_RUN: "train-20260101-000000-beef", TAG_EXPIRES: OLD}) == (
        datetime(2020, 1, 1, tzinfo=UTC),
        "",
    )
    assert tagged_expiry({TAG_RUN: "stray", TAG_EXPIRES: OLD})[1] == ""  # a plain label: a crash's leftover
    for tags, why in HOSTILE:
        when, said = tagged_expiry(tags)
        assert when is None and why in said, (tags, said)


def test_aws_gc_names_and_keeps_resources_with_hostile_tags(moto: Any) -> None:  # noqa: F811
    from gpucloud.providers.aws import AwsProvider, reset_shared
    from tests.support.aws_faults import HOOKS, install

    install()
    HOOKS.reset()
    reset_shared(channels_only=True)
    prov = AwsProvider(retry_base_s=0.01, poll_s=0.05, sleep=lambda s: None, public_ip=lambda: "203.0.113.7")
    ec2 = moto.client("ec2", "us-west-2")
    volumes = []
    hostile = [(t, why) for t, why in HOSTILE if all(v.isprintable() for v in t.values())]  # what EC2 takes
    for tags, _ in hostile:
        spec = [{"ResourceType": "volume", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
        volumes.append(ec2.create_volume(AvailabilityZone="us-west-2a", Size=1, TagSpecifications=spec)["VolumeId"])
    ours = [{"Key": TAG_RUN, "Value": "stray"}, {"Key": TAG_EXPIRES, "Value": OLD}]
    stray = ec2.create_volume(
        AvailabilityZone="us-west-2a", Size=1, TagSpecifications=[{"ResourceType": "volume", "Tags": ours}]
    )["VolumeId"]
    try:
        lines = prov.gc(datetime.now(UTC), dry_run=False)
        text = "\n".join(lines)
        left = {v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]}
        assert set(volumes) <= left and stray not in left, text
        for vol, (_, why) in zip(volumes, hostile, strict=True):
            assert f"aws/us-west-2: volume {vol} left alone: its " in text and why in text, text
    finally:
        HOOKS.reset()
        for vol in volumes:  # the session's moto server is shared: later tests count what is left tagged
            ec2.delete_volume(VolumeId=vol)


def test_azure_gc_names_and_keeps_groups_with_hostile_tags(arm: Any, provider: Any) -> None:  # noqa: F811
    groups = provider.resource.resource_groups
    for i, (tags, _) in enumerate(HOSTILE):
        groups.create_or_update(f"hostile-{i}", {"location": "eastus", "tags": tags})
    groups.create_or_update(
        "gpucloud-stray",
        {
            "location": "eastus",
            "tags": {TAG_RUN: "stray", TAG_EXPIRES: expiry_tag(datetime.now(UTC) - timedelta(hours=1))},
        },
    )
    lines = provider.gc(datetime.now(UTC), dry_run=False)
    text = "\n".join(lines)
    names = {r["id"].rsplit("/", 1)[-1] for r in arm.snapshot()}
    assert {f"hostile-{i}" for i in range(len(HOSTILE))} <= names and "gpucloud-stray" not in names, text
    for i, (_, why) in enumerate(HOSTILE):
        assert f"azure: resource group hostile-{i} left alone: its " in text and why in text, text
    assert "\x1b" not in text


def test_gc_exits_75_naming_what_it_could_not_cancel(
    monkeypatch: pytest.MonkeyPatch, gpucloud_home: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpucloud.contract import registry
    from gpucloud.run.commands import collect_garbage

    class Stuck:
        def gc(self, now: datetime, *, dry_run: bool) -> list[str]:
            raise GcIncomplete(
                ["job 7 of run r past its expiry (NOT cancelled: scancel failed)"], ["job 7: scancel failed"]
            )

    monkeypatch.setattr(registry, "get_provider", lambda name: Stuck())
    with pytest.raises(GcIncomplete) as err:
        collect_garbage(dry_run=False, assume_yes=True, cloud="slurm")
    assert err.value.exit_code == 75 and "job 7: scancel failed" in err.value.message
    assert "NOT cancelled: scancel failed" in capsys.readouterr().out
