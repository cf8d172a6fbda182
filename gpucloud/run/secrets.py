"""The job's secrets delivered to its nodes while the CLI follows the run: each node's values,
sealed (gpucloud/vm/agent/sealed.py) to the one Ed25519 key that claims the node, PUT to the
node's `secrets.sealed` object, which its manifest lets it GET. The channel holds only the sealed
bytes; the state store and the run's files hold names only.

Why the claim and not a grant: a grant (URL) travels in the manifest, the manifest's URL in
user-data, which anyone allowed to read the VM's attributes can read. The claimed key's private
half never leaves the node. A node claimed by two keys gets nothing (the run then ends in
`error`, channel_trust.py); docs/DATA.md, "Secrets", says what is left.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpucloud.channel import trust as channel_trust
from gpucloud.channel.run_objects import secrets_key
from gpucloud.vm.agent import sealed

SEAL_POLL_S = 1.0
RESEAL_CHECK_S = 10.0  # once every node has its secrets: how often to look for a node's new key


class SecretDelivery:
    """Seal each node's secrets once per claimed key (a relaunched node claims a new key)."""

    def __init__(
        self, run_id: str, num_nodes: int, values: Mapping[str, str], data: Any = None, registry: Any = None
    ) -> None:
        self.run_id, self.num_nodes = run_id, num_nodes
        self._values = values
        self.data = data  # a data_grants.DataPlan: the node's input/output grants ride sealed too
        self.registry = registry  # a pull_login.PullLogins: the image's pull login, sealed as well
        self.sealed_to: dict[int, str] = {}  # rank -> the key its secrets were sealed to
        self.warned: set[str] = set()
        self.checked_at = 0.0

    @property
    def wanted(self) -> bool:
        return bool(self._values) or self.data is not None or self.registry is not None

    def done(self) -> bool:
        return not self.wanted or len(self.sealed_to) == self.num_nodes

    def reset(self) -> None:
        """A new attempt: its nodes claim new keys."""
        self.sealed_to.clear()

    def step(self, launch: Any) -> list[str]:
        """Seal to every node that has exactly one claim and none yet (or a new one); the problems seen."""
        problems: list[str] = []
        channel = launch.channel
        if not self.wanted:
            return problems
        for rank in range(self.num_nodes):
            try:
                key, problem = channel_trust.claimed_key(channel.claims(self.run_id, rank))
            except channel_trust.ObjectRefused as exc:
                key, problem = None, exc.message
            if problem:
                problems.append(f"node {rank}: {problem}: its secrets are withheld")
                continue
            if key is None or self.sealed_to.get(rank) == key:
                continue
            doc: dict[str, Any] = {"run_id": self.run_id, "rank": rank, "env": dict(self._values)}
            if self.data is not None:
                doc["data"] = self.data.grants(
                    channel, self.run_id, rank, self.num_nodes, launch.deadline, getattr(launch, "handle", None)
                )
            if self.registry is not None:
                doc["registry"] = self.registry.current()
            blob = sealed.seal(key, json.dumps(doc, separators=(",", ":")).encode())
            channel.put_bytes(secrets_key(self.run_id, rank), blob)
            self.sealed_to[rank] = key
        return problems

    def adopt(self, launch: Any) -> None:
        """`gpucloud watch`: the attempt it finds was delivered by the CLI that launched it. A node's
        present key counts as sealed when its sealed object is there (not written again with the
        watcher's values); a node with a key and no object (its launcher died between the node's
        claim and the seal: an attempt's objects start empty) is sealed to by this watcher. Its node
        identity is given the job's data prefixes again (the same document), so what the watcher
        seals first is a relaunch's, which claims new keys and gets its own grants and data policy."""
        if launch is None or not self.wanted:
            return
        for rank in range(self.num_nodes):
            try:
                key, problem = channel_trust.claimed_key(launch.channel.claims(self.run_id, rank))
            except channel_trust.ObjectRefused:
                continue
            if key is not None and not problem and launch.channel.get_bytes(secrets_key(self.run_id, rank)):
                self.sealed_to[rank] = key
        handle = getattr(launch, "handle", None)
        if self.data is not None and handle is not None:
            self.data.admitted.add((self.run_id, handle.attempt))
            self.data.admit(handle)

    def follow(self, launch: Any, warn: Callable[[str], None], now: Callable[[], float] = time.monotonic) -> None:
        """One step of the CLI's follow loop; each problem is said once. Once every node has its
        secrets, a look every RESEAL_CHECK_S still: a node started again in the same attempt (a Slurm
        requeue) claims a new key, and its secrets are sealed again to that key."""
        if not self.wanted:
            return
        if self.done():
            if now() - self.checked_at < RESEAL_CHECK_S:
                return
            self.checked_at = now()
        for problem in self.step(launch):
            if problem not in self.warned:
                self.warned.add(problem)
                warn(problem)

    def before_detach(self, launch: Any, progress: Any) -> None:
        """Nobody follows a detached run: its secrets go to the nodes before `run --detach` returns."""
        if launch is None or not self.wanted:
            return
        progress.info("waiting for the node(s) to publish their keys, to seal the secrets to them")
        if not self.wait(launch):
            progress.warn("the secrets were not delivered: the job cannot start; it ends at its deadline")

    def wait(self, launch: Any, *, sleep: Callable[[float], None] = time.sleep) -> bool:
        """`run --detach`: deliver before returning (nobody follows the run after); False at the deadline."""
        while not self.done():
            if self.step(launch) or time.time() > launch.deadline:
                return self.done()
            if not self.done():
                sleep(SEAL_POLL_S)
        return True
