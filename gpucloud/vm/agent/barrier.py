"""The multi-node barrier through the channel: PUT this node's private address to `ready_put`,
then GET every rank's `ready` until all are there, or the barrier's time passes (the node ends in
state error naming the ranks that never showed up). Stdlib only, Python >= 3.8 syntax.

Why signed: the `ready_put` grants ride in the manifests, whose URLs are in user-data, so whoever can
read the VM's user-data can write any rank's `ready` and point every rank's MASTER_ADDR at a machine
of theirs. A node that signs its results (the manifest's `sign` line) also signs its `ready` with
its own key (claim.py): address, rank and run id. Where the manifest lets it read each peer's claims
(`claims_get <rank> URL`, written by every channel backend for a multi-node run), every rank takes a
peer's address only when exactly one key claims that peer, that key is the one in the `ready`, and
the signature holds; anything else fails the barrier closed, naming the rank (docs/SECURITY.md,
"Multi-node rendezvous").
"""

from __future__ import annotations

import os
import re
import subprocess
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from gpucloud.vm import protocol
from gpucloud.vm.agent.stage_api import StageFailed
from gpucloud.vm.agent.transfer import Transfer

# An address a rank may hand its peers: an IPv4/IPv6 address or a host name, nothing a shell, an
# env file or a terminal would read otherwise.
ADDRESS = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,252}")
# What a node reads of a peer's claims: one honest claim is one line or one listed name; more than
# one already fails the barrier, so the first few are all it needs.
CLAIMS_MAX = 256 * 1024  # 100 S3 keys of up to 1 KiB each, in XML
CLAIM_FILES_MAX = 16
CLAIM_FILE = re.compile(r"claim-[0-9a-f]{32}")


@dataclass
class ReadyKeys:
    """How this node signs its `ready` and checks its peers' (None/empty where the node does not sign)."""

    run_id: str
    pub: Callable[[], str]  # this node's public key (base64), '' when it has none
    sign: Callable[[bytes], Optional[str]]
    verify: Callable[[str, bytes, str], bool]


def node_ip(environ: Mapping[str, str], known: bool) -> str:
    """GPUCLOUD_NODE_IP, else the source of the default route (the primary NIC), else `hostname -I`."""
    if known:
        return environ.get("GPUCLOUD_NODE_IP", "127.0.0.1")
    ip = environ.get("GPUCLOUD_NODE_IP", "")
    if not ip:
        try:
            out = subprocess.run(
                ["ip", "-4", "-o", "route", "get", "1.1.1.1"], capture_output=True, text=True, timeout=10, check=False
            ).stdout
            m = re.search(r"src ([0-9.]+)", out)
            ip = m.group(1) if m else ""
        except (OSError, subprocess.SubprocessError):
            ip = ""
    if not ip:
        try:
            ip = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            ip = ""
    return (ip.split() or [""])[0]


class Barrier:
    def __init__(
        self,
        manifest: protocol.Manifest,
        transfer: Transfer,
        vm_dir: Path,
        rank: int,
        nodes: int,
        timeout_s: float,
        now: Callable[[], float],
        sleep: Callable[[float], None],
        tick: float,
        log: Callable[[str], None],
        stopping: Callable[[], bool],
        keys: Optional[ReadyKeys] = None,
    ) -> None:
        self.manifest = manifest
        self.transfer = transfer
        self.vm_dir = vm_dir
        self.rank = rank
        self.nodes = nodes
        self.timeout_s = timeout_s
        self.now = now
        self.sleep = sleep
        self.tick = tick
        self.log = log
        self.stopping = stopping
        self.keys = keys if manifest.signs else None
        # Peers are checked against their claims where the channel lets every rank read them.
        self.checked = self.keys is not None and all(manifest.ranked_url("claims_get", r) for r in range(nodes))
        self.verified: Dict[int, Tuple[str, str, str]] = {}

    def publish(self, ip: str) -> None:
        """This node's `ready`: its address, signed when the node signs (StageFailed when it cannot)."""
        pub = sig = ""
        if self.keys is not None:  # signing waits for the key the node claims itself with
            sig = self.keys.sign(protocol.ready_signed_bytes(self.keys.run_id, self.rank, ip)) or ""
            pub = self.keys.pub() if sig else ""
            if not pub and self.checked:
                raise StageFailed("barrier: this node has no key to sign its address with (its peers would refuse it)")
        ready = self.vm_dir / "ready"
        ready.write_bytes(protocol.ready_text(ip, pub, sig))
        if not self.transfer.put_file(self.manifest.url("ready_put"), ready):
            raise StageFailed("barrier: could not publish this node's address")

    def peer(self, rank: int) -> str:
        """Rank `rank`'s address, '' while it has none (or, checked, while no key claims it yet);
        StageFailed when what is there cannot be its own."""
        body = self.transfer.get(self.manifest.ranked_url("ready_get", rank), max_time=30)
        ip, pub, sig = protocol.parse_ready(body or b"")
        if not ip:
            return ""
        if not ADDRESS.fullmatch(ip):
            raise StageFailed(f"barrier: node {rank}'s ready object holds no address: refused")
        if not self.checked or self.keys is None:
            return ip
        signed = protocol.ready_signed_bytes(self.keys.run_id, rank, ip)
        if self.verified.get(rank) != (pub, sig, ip) and not (pub and sig and self.keys.verify(pub, signed, sig)):
            raise StageFailed(
                f"barrier: node {rank}'s address is not signed by the key in it: refused (someone who could "
                "read the machines' user-data wrote it)"
            )
        self.verified[rank] = (pub, sig, ip)  # one openssl call per object, not one per poll
        claims = protocol.claim_fingerprints(self.claims_of(rank))
        if not claims:
            return ""  # its claim is not published yet
        if len(claims) > 1:
            raise StageFailed(
                f"barrier: node {rank} is claimed by {len(claims)} keys: refused (someone who could read the "
                "machines' user-data claimed it too)"
            )
        if claims[0] != protocol.fingerprint(pub):
            raise StageFailed(f"barrier: node {rank}'s address is signed by a key that does not claim node {rank}")
        return ip

    def claims_of(self, rank: int) -> bytes:
        """What `claims_get` says of rank's claims (b'' while nothing can be read). A file:// URL
        names a folder on this node's own filesystem (file, ssh, Slurm channels): its claim files
        are listed here, since curl's GET of a folder returns nothing; names are filtered before the
        cap, so junk names cannot push a claim out. StageFailed for a truncated S3 listing."""
        url = self.manifest.ranked_url("claims_get", rank)
        if not url.startswith("file://"):
            body = self.transfer.get(url, max_time=30, limit=CLAIMS_MAX) or b""
            if b"<IsTruncated>true</IsTruncated>" in body:  # a claim may be on a page it cannot read
                raise StageFailed(
                    f"barrier: node {rank} has more claim objects than one listing shows: refused (someone "
                    "who could read the machines' user-data added them)"
                )
            return body
        folder = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
        try:
            names = [n for n in os.listdir(folder) if CLAIM_FILE.fullmatch(n)]
        except OSError:  # not made yet
            return b""
        return "\n".join(sorted(names)[:CLAIM_FILES_MAX]).encode()  # more than one is refused anyway

    def wait(self, ip: str) -> List[str]:
        """Every node's address in rank order; raises StageFailed."""
        if not ip:
            raise StageFailed("barrier: cannot find this node's private IP address")
        self.publish(ip)
        how = ", each checked against its claim" if self.checked else ""
        self.log(f"node {self.rank} is {ip}; waiting for all {self.nodes} nodes{how} (at most {int(self.timeout_s)}s)")
        end = self.now() + self.timeout_s
        seen: Dict[int, str] = {}
        while True:
            for r in range(self.nodes):
                if r not in seen:
                    found = self.peer(r)
                    if found:
                        seen[r] = found
            missing = [str(r) for r in range(self.nodes) if r not in seen]
            if not missing:
                break
            if self.now() >= end:
                raise StageFailed(
                    f"barrier: node(s) {' '.join(missing)} not ready after {int(self.timeout_s)}s "
                    "(slow or failed boot; see their status)"
                )
            if self.stopping():
                raise StageFailed("barrier: the run is ending")
            self.sleep(self.tick)
        ips = [seen[r] for r in range(self.nodes)]
        self.log(f"all {self.nodes} nodes ready: {' '.join(ips)}; MASTER_ADDR={ips[0]}")
        return ips
