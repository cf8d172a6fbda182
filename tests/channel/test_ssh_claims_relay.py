"""SSH hosts' side of `claims_get` (docs/SECURITY.md, "Multi-node rendezvous"): every node's manifest
names each rank's log folder on the node's own host, and the CLI's relay copies a rank's claim
names there before its `ready`, only names a peer's barrier would read (32 hex digits), and only
once the rank has claimed itself. Each "host" is a local folder; the relay's shell scripts run in
bash as they would over ssh (the real-sshd run is tests/providers/ssh/test_ssh_e2e.py)."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpucloud.providers.ssh import channel as ssh_channel
from gpucloud.providers.ssh.channel import SshChannel
from gpucloud.providers.ssh.transport import Result
from gpucloud.vm import protocol
from gpucloud.vm.agent.barrier import Barrier

RUN = "relay-20261206-000000-abcd"
PUB = "A" * 43 + "="


class LocalHosts(SshChannel):
    """An SshChannel whose hosts are folders here: each script runs in bash with that host's root."""

    def __init__(self, tmp: Path, hosts: list[str]) -> None:
        super().__init__(hosts)
        self.tmp = tmp
        self.scripts: list[tuple[str, str]] = []

    def _run(self, host: str, script: str, **kwargs: object) -> Result:
        self.scripts.append((host, script))
        root = self.tmp / host
        root.mkdir(exist_ok=True)
        data = kwargs.get("input")
        done = subprocess.run(
            ["bash", "-c", f"umask 077; R={root}; {script}"],
            input=data if isinstance(data, bytes) else b"",
            capture_output=True,
            check=False,
        )
        return Result(done.returncode, done.stdout, done.stderr.decode())


def test_relay_copies_claim_names_before_the_ready_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hosts = LocalHosts(tmp_path, ["h0", "h1"])
    monkeypatch.setattr(ssh_channel, "remote_root", lambda host: str(tmp_path / host))
    urls = hosts.prepare(RUN, 2, datetime.now(UTC) + timedelta(hours=1))
    manifest = protocol.parse_manifest((tmp_path / "h1" / "channel" / "runs" / RUN / "node-1" / "manifest").read_text())
    folder0 = tmp_path / "h1" / "channel" / "runs" / RUN / "node-0" / "log"
    assert manifest.ranked_url("claims_get", 0) == folder0.as_uri() + "/", urls
    log0 = tmp_path / "h0" / "channel" / "runs" / RUN / "node-0" / "log"
    (tmp_path / "h0" / "channel" / "runs" / RUN / "node-0" / "ready").write_text("10.0.0.1\n")
    hosts.relay_ready(RUN)
    assert not (tmp_path / "h1" / "channel" / "runs" / RUN / "node-0" / "ready").exists(), "no claim: not yet"
    (log0 / protocol.claim_name(PUB)).write_text(PUB + "\n")
    (log0 / "claim-$(touch pwned)").write_text("x")  # a name no barrier reads, and no shell either
    hosts.relay_ready(RUN)
    assert sorted(p.name for p in folder0.iterdir()) == [protocol.claim_name(PUB)]
    assert (tmp_path / "h1" / "channel" / "runs" / RUN / "node-0" / "ready").read_text() == "10.0.0.1\n"
    assert not list(tmp_path.rglob("pwned"))
    barrier = Barrier(manifest, None, tmp_path, 1, 2, 30, lambda: 0, lambda s: None, 1, print, lambda: False)  # type: ignore[arg-type]
    assert protocol.claim_fingerprints(barrier.claims_of(0)) == [protocol.fingerprint(PUB)]
