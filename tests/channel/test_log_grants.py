"""The VM's log grant: one grant per node whatever the run's length. S3: one
presigned POST whose policy admits only the node's log prefix and parts up to LOG_PART_MAX (moto
accepts the form but does not enforce the policy, so the policy document is checked here); Azure:
one append blob per node with an add-only SAS, read back by byte ranges (Azurite enforces both)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import urllib.parse
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpucloud.channel.run_objects import LOG_PART_MAX, URL_MARGIN, Channel, iter_manifest
from gpucloud.run.log import LogMirror
from tests.support.azure_fixtures import arm, azurite, fake_arm_server  # noqa: F401  (fixtures)
from tests.support.fake_arm import FakeArm
from tests.support.moto_server import moto, moto_server  # noqa: F401  (fixtures)

NO_AWS_ENV = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # the VM holds no credentials


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["curl", "-sS", *args], capture_output=True, text=True, timeout=30, env=NO_AWS_ENV)


def manifest_of(channel: Channel, url: str) -> list[tuple[str, str]]:
    return list(iter_manifest(curl("-f", url).stdout))


def manifest_sizes(channel: Channel, run: str) -> tuple[int, int]:
    """Manifest bytes of one node for a 1 min and a 6 h deadline."""
    now = datetime.now(UTC)
    short = channel.prepare(f"{run}-a", 1, now + timedelta(minutes=1))[0]
    long = channel.prepare(f"{run}-b", 1, now + timedelta(hours=6))[0]
    return len(curl("-f", short).stdout), len(curl("-f", long).stdout)


# ---- S3: presigned POST ------------------------------------------------------------------------


@pytest.fixture
def s3(moto: Any) -> Any:  # noqa: F811
    from gpucloud.providers.aws import AwsProvider

    return AwsProvider(retry_base_s=0.01, poll_s=0.05, sleep=lambda s: None).channel("us-east-1")


def post_grant(pairs: list[tuple[str, str]]) -> tuple[str, str, dict[str, str]]:
    url = dict(pairs)["log_post"]
    prefix = dict(pairs)["log_post_key"]
    fields = dict(rest.split(" ", 1) for key, rest in pairs if key == "log_post_field")
    return url, prefix, fields


def vm_post(url: str, prefix: str, fields: dict[str, str], index: int, part: Path) -> subprocess.CompletedProcess[str]:
    """What the bootstrap's log_up does: the fields, the part's key, then the file (last)."""
    form = [arg for name, value in fields.items() for arg in ("--form-string", f"{name}={value}")]
    return curl("-f", "-o", "/dev/null", *form, "--form-string", f"key={prefix}{index:06d}", "-F", f"file=@{part}", url)


def test_s3_log_grant_is_one_post_limited_to_the_node_log_prefix(s3: Any, tmp_path: Path) -> None:
    deadline = datetime.now(UTC) + timedelta(hours=2)
    urls = s3.prepare("grant", 2, deadline)
    for rank, manifest_url in enumerate(urls):
        pairs = manifest_of(s3, manifest_url)
        assert not any(key == "log_put" for key, _ in pairs)
        url, prefix, fields = post_grant(pairs)
        assert prefix == f"runs/grant/node-{rank}/log/" and "key" not in fields
        policy = json.loads(base64.b64decode(fields["policy"]))
        expiry = datetime.fromisoformat(policy["expiration"].replace("Z", "+00:00"))
        assert abs((expiry - (deadline + URL_MARGIN)).total_seconds()) < 120
        conditions = policy["conditions"]
        ranges = [c for c in conditions if isinstance(c, list) and c[0] == "content-length-range"]
        assert ranges == [["content-length-range", 0, LOG_PART_MAX]]
        keyed = [
            c for c in conditions if (isinstance(c, list) and c[1] == "$key") or (isinstance(c, dict) and "key" in c)
        ]
        assert keyed == [["starts-with", "$key", prefix]]  # the node's prefix, nothing wider, no other key rule
        exact = {k: v for c in conditions if isinstance(c, dict) for k, v in c.items()}
        assert exact.pop("bucket") == s3.bucket
        assert exact == {k: v for k, v in fields.items() if k not in ("policy", "x-amz-signature")}
        # the VM's upload, as the bootstrap sends it, lands where readers look
        part = tmp_path / "part"
        part.write_bytes(f"line of node {rank}\n".encode())
        assert vm_post(url, prefix, fields, 0, part).returncode == 0
        status = {"run_id": "grant", "rank": rank, "state": "running", "log_parts": 1, "log_bytes": 15}
        s3.put_bytes(f"runs/grant/node-{rank}/status.json", json.dumps(status).encode())
        assert s3.read_log_parts("grant", rank) == [f"line of node {rank}\n".encode()]


def test_s3_post_policy_lives_at_most_seven_days(s3: Any) -> None:
    url = s3.prepare("far", 1, datetime.now(UTC) + timedelta(days=30))[0]
    _, _, fields = post_grant(manifest_of(s3, url))
    expiry = datetime.fromisoformat(json.loads(base64.b64decode(fields["policy"]))["expiration"].replace("Z", "+00:00"))
    assert expiry <= datetime.now(UTC) + timedelta(days=7, seconds=5)


def test_s3_manifest_size_does_not_depend_on_max_duration(s3: Any) -> None:
    short, long = manifest_sizes(s3, "size")
    assert abs(short - long) < 16 and long < 6000, (short, long)


# ---- Azure: one append blob per node -------------------------------------------------------------


@pytest.fixture
def blob(arm: FakeArm, azurite: Any, monkeypatch: pytest.MonkeyPatch) -> Any:  # noqa: F811
    from gpucloud.providers.azure import AzureProvider

    monkeypatch.setenv("GPUCLOUD_AZURE_BLOB_ENDPOINT", azurite.blob_endpoint)
    return AzureProvider().channel("eastus")


def vm_append(url: str, part: Path, offset: int) -> str:
    """What the bootstrap's log_up does on Azure; returns the HTTP status."""
    return curl(
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-T",
        str(part),
        "-H",
        "x-ms-version: 2022-11-02",
        "-H",
        f"x-ms-blob-condition-appendpos: {offset}",
        f"{url}&comp=appendblock",
    ).stdout


def test_azure_log_grant_is_one_add_only_append_blob(blob: Any, tmp_path: Path) -> None:
    urls = blob.prepare("app", 2, datetime.now(UTC) + timedelta(hours=1))
    url = dict(manifest_of(blob, urls[1]))["log_append"]
    assert "/runs/app/node-1/log.append?" in url
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["sp"] == ["a"]
    props = blob._container.get_blob_client("runs/app/node-1/log.append").get_blob_properties()
    assert props.blob_type == "AppendBlob" and props.size == 0
    part = tmp_path / "part"
    part.write_bytes(b"one\n")
    assert vm_append(url, part, 0) == "201"
    assert vm_append(url, part, 0) == "412"  # a retry of a part that landed: not appended twice
    assert vm_append(url, part, 4) == "201"
    # add only: the URL reads nothing and overwrites nothing
    assert curl("-o", "/dev/null", "-w", "%{http_code}", url).stdout == "403"
    assert (
        curl("-o", "/dev/null", "-w", "%{http_code}", "-T", str(part), "-H", "x-ms-blob-type: BlockBlob", url).stdout
        == "403"
    )
    assert blob.read_log_parts("app", 1) == []  # nothing counts before status.json says so
    blob.put_bytes(
        "runs/app/node-1/status.json", json.dumps({"state": "running", "log_parts": 2, "log_bytes": 8}).encode()
    )
    assert b"".join(blob.read_log_parts("app", 1)) == b"one\none\n"
    # a failover attempt's prepare starts the node's log afresh
    blob.prepare("app", 2, datetime.now(UTC) + timedelta(hours=1))
    assert blob._container.get_blob_client("runs/app/node-1/log.append").get_blob_properties().size == 0


def test_azure_log_is_read_by_byte_ranges_from_the_mirror_position(
    blob: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpucloud.providers.azure.channel as azure_channel

    monkeypatch.setattr(azure_channel, "LOG_PART_MAX", 5)  # small ranged reads, to see them
    url = dict(manifest_of(blob, blob.prepare("rng", 2, datetime.now(UTC) + timedelta(hours=1))[0]))["log_append"]
    part = tmp_path / "part"
    offset = 0
    for text in (b"alpha\nbeta\n", b"gamma\n"):
        part.write_bytes(text)
        assert vm_append(url, part, offset) == "201"
        offset += len(text)
    blob.put_bytes(
        "runs/rng/node-0/status.json", json.dumps({"state": "running", "log_parts": 1, "log_bytes": 11}).encode()
    )
    assert list(blob.iter_log("rng", 0, 0)) == [(b"alpha", 5), (b"\nbeta", 10), (b"\n", 11)]
    mirror = LogMirror(tmp_path / "home", "rng", num_nodes=2)
    mirror.sync(blob)
    assert mirror.read_new() == b"[node 0] alpha\n[node 0] beta\n"
    blob.put_bytes(
        "runs/rng/node-0/status.json", json.dumps({"state": "running", "log_parts": 2, "log_bytes": 17}).encode()
    )
    mirror.sync(blob, final=True)
    assert mirror.read_new() == b"[node 0] gamma\n"


def test_azure_manifest_size_does_not_depend_on_max_duration(blob: Any) -> None:
    short, long = manifest_sizes(blob, "size")
    assert abs(short - long) < 16 and long < 6000, (short, long)


# ---- claims_get: what a node reads of a peer's claims (docs/SECURITY.md, "Multi-node rendezvous") -----

PUB = base64.b64encode(bytes(range(32))).decode()  # a public key's shape (44 base64 characters)
CLAIMS_SIZES: dict[str, dict[int, int]] = {}


def claims_lines(channel: Channel, run: str, nodes: int) -> tuple[list[dict[int, str]], int]:
    """Every node's `claims_get` URLs by rank, and node 0's manifest bytes."""
    urls = channel.prepare(run, nodes, datetime.now(UTC) + timedelta(hours=1))
    out, size = [], 0
    for rank, url in enumerate(urls):
        text = curl("-f", url).stdout
        if not size:  # node 0's manifest bytes, then those of its claims_get lines
            size = len(text)
            CLAIMS_SIZES.setdefault("claims_get lines", {})[f"{type(channel).__name__} {nodes}"] = sum(
                len(line) + 1 for line in text.splitlines() if line.startswith("claims_get ")
            )
        ranked = [rest.split(" ", 1) for key, rest in iter_manifest(text) if key == "claims_get"]
        out.append({int(r): u for r, u in ranked})
        assert len(ranked) == nodes, f"node {rank} has {len(ranked)} claims_get lines for {nodes} nodes"
    return out, size


@pytest.mark.parametrize("nodes", [2, 8])
def test_s3_claims_get_lists_only_the_ranks_claim_objects(s3: Any, nodes: int) -> None:
    from gpucloud.vm import protocol

    lines, size = claims_lines(s3, f"cg{nodes}", nodes)
    CLAIMS_SIZES.setdefault("s3", {})[nodes] = size
    assert size < 64 * 1024, size
    prefix = f"runs/cg{nodes}/node-1/log/"
    s3.put_bytes(prefix + "000000", b"a log part")
    s3.put_bytes(f"runs/cg{nodes}/node-0/log/" + protocol.claim_name(PUB), PUB.encode())
    url = lines[0][1]
    assert protocol.claim_fingerprints(curl("-f", url).stdout.encode()) == []  # node 1 has not claimed yet
    s3.put_bytes(prefix + protocol.claim_name(PUB), PUB.encode())
    listing = curl("-f", url).stdout
    assert protocol.claim_fingerprints(listing.encode()) == [protocol.fingerprint(PUB)]
    assert "000000" not in listing and "node-0" not in listing and PUB not in listing  # names, nothing else
    assert all(line[1] == url for line in lines)  # every node reads node 1's claims the same way
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)  # moto does not check signatures: S3 does
    assert query["prefix"] == [prefix + "claim-"] and query["max-keys"] == ["100"] and query["X-Amz-Signature"]
    assert curl("-f", "-T", "/dev/null", url).returncode != 0, "a listing grant writes nothing"


@pytest.mark.parametrize("nodes", [2, 8])
def test_azure_claims_get_reads_only_the_ranks_claim_blob(
    blob: Any, nodes: int, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpucloud.vm import protocol

    lines, size = claims_lines(blob, f"cg{nodes}", nodes)
    CLAIMS_SIZES.setdefault("azure", {})[nodes] = size
    assert size < 64 * 1024, size
    url = lines[0][1]
    assert f"/runs/cg{nodes}/node-1/claim.append?" in url
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["sp"] == ["r"]
    assert protocol.claim_fingerprints(curl("-f", url).stdout.encode()) == []
    blob._container.get_blob_client(f"runs/cg{nodes}/node-1/claim.append").append_block((PUB + "\n").encode())
    assert protocol.claim_fingerprints(curl("-f", url).stdout.encode()) == [protocol.fingerprint(PUB)]
    put = curl("-f", "-T", "/dev/null", "-H", "x-ms-blob-type: BlockBlob", url)
    assert put.returncode != 0, "a read SAS writes nothing"
    with capsys.disabled():
        print(f"\nnode 0's manifest bytes by backend and node count: {CLAIMS_SIZES}")


def s3_barrier_of_rank_0(s3: Any, run: str, tmp_path: Path) -> Any:
    """Rank 0's barrier as the agent builds it, over its real manifest and curl."""
    from gpucloud.vm import protocol
    from gpucloud.vm.agent.barrier import Barrier, ReadyKeys
    from gpucloud.vm.agent.claim import verify
    from gpucloud.vm.agent.transfer import Transfer

    url = s3.prepare(run, 2, datetime.now(UTC) + timedelta(hours=1))[0]
    manifest = protocol.parse_manifest(curl("-f", url).stdout)
    keys = ReadyKeys(run, lambda: "", lambda raw: None, verify)
    return Barrier(
        manifest, Transfer(), tmp_path, 0, 2, 30, lambda: 0.0, lambda s: None, 1.0, print, lambda: False, keys
    )


def thief_before(tmp_path: Path, real: str) -> Any:
    """A reader's key whose claim sorts before `real`'s (a few tries), signing node 1's `ready`."""
    from gpucloud.vm import protocol
    from gpucloud.vm.agent.claim import NodeKey

    for i in range(64):
        (tmp_path / f"t{i}").mkdir()
        key = NodeKey(tmp_path / f"t{i}", lambda line: None)
        pub = key.make()
        assert pub
        key.pub_path.write_text(pub + "\n")
        key.published_path.touch()
        key.mark_done()
        if protocol.fingerprint(pub) < real:
            return key
    raise AssertionError("no key sorted first in 64 tries")


@pytest.mark.parametrize("junk", [1, 100], ids=["a-junk-key", "a-page-of-junk"])
def test_s3_junk_keys_cannot_push_a_claim_off_the_listing(s3: Any, tmp_path: Path, junk: int) -> None:
    """The log grant can add any key under the claim prefix: a reader adds junk keys that sort first
    and its own claim, sorted before node 1's, and signs node 1's `ready` with it. Rank 0 sees both
    claims (refused: two keys), or a truncated listing (refused), never only the reader's."""
    from gpucloud.vm import protocol
    from gpucloud.vm.agent.stage_api import StageFailed

    run = f"junk{junk}"
    barrier = s3_barrier_of_rank_0(s3, run, tmp_path)
    log = f"runs/{run}/node-1/log/"
    real = protocol.fingerprint(PUB)
    thief = thief_before(tmp_path, real)
    for i in range(junk):
        s3.put_bytes(f"{log}claim-{i:04d}", b"")
    s3.put_bytes(log + protocol.claim_name(thief.public()), thief.public().encode())
    s3.put_bytes(log + protocol.claim_name(PUB), PUB.encode())
    sig = thief.sign(protocol.ready_signed_bytes(run, 1, "6.6.6.6"), lambda event, s: True)
    s3.put_bytes(f"runs/{run}/node-1/ready", protocol.ready_text("6.6.6.6", thief.public(), sig or ""))
    with pytest.raises(StageFailed) as refused:
        barrier.peer(1)
    assert ("node 1 is claimed by 2 keys" if junk == 1 else "more claim objects than one listing") in str(refused.value)
