"""The multi-node barrier through the channel: PUT this node's private address to `ready_put`,
then GET every rank's `ready` until all are there, or the barrier's time passes (the node ends in
state error naming the ranks that never showed up). Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Callable, Dict, List, Mapping

from gpucloud.vm import protocol
from gpucloud.vm.agent.stage_api import StageFailed
from gpucloud.vm.agent.transfer import Transfer


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

    def wait(self, ip: str) -> List[str]:
        """Every node's address in rank order; raises StageFailed."""
        if not ip:
            raise StageFailed("barrier: cannot find this node's private IP address")
        ready = self.vm_dir / "ready"
        ready.write_text(ip + "\n")
        if not self.transfer.put_file(self.manifest.url("ready_put"), ready):
            raise StageFailed("barrier: could not publish this node's address")
        self.log(f"node {self.rank} is {ip}; waiting for all {self.nodes} nodes (at most {int(self.timeout_s)}s)")
        end = self.now() + self.timeout_s
        seen: Dict[int, str] = {}
        while True:
            missing = []
            for r in range(self.nodes):
                if r in seen:
                    continue
                body = self.transfer.get(self.manifest.ranked_url("ready_get", r), max_time=30)
                line = (body or b"").decode("utf-8", "replace").strip().splitlines()
                if line and line[0].strip():
                    seen[r] = line[0].strip()
                else:
                    missing.append(str(r))
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
