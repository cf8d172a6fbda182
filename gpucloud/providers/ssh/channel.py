"""The channel of an SSH run: a file channel on each host, read and written by the CLI over ssh.

Why a file channel on the host (and not a Channel backend the VM reaches over the network): the
bootstrap already speaks file:// URLs through curl (the local provider's FileChannel), a user's own
machine has no object store, and the CLI can always reach the host while the host may not reach the
CLI. So the VM writes status, log parts and artifacts to files under its host's remote root, and
the CLI pulls them with `ssh HOST cat` over the run's multiplexed connection.

Keys are the same as on every backend (docs/INTERNALS.md, "Channel"). `runs/<id>/node-<r>/...` lives
on the run's r-th host; run-level keys (the code tarball) are written to every host. URLs carry a
placeholder for the host's remote root, filled in when a manifest or bootstrap is written to that
host (homes differ between hosts). Multi-node: each node's `ready` is copied to its peers' hosts by
whichever CLI process reads rank 0's status (`run`, `logs --follow`, `status`, `ls`), and by a small
background relay the provider starts with the run (`start_relay`), so a `--detach`ed run crosses
its barrier with nobody following it.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
import urllib.parse
from datetime import datetime
from pathlib import Path

from gpucloud.channel import trust as channel_trust
from gpucloud.channel.run_objects import (
    SMALL_OBJECT_MAX,
    Channel,
    ObjectRefused,
    checkpoint_keys,
    log_prefix,
    node_prefix,
)
from gpucloud.providers.ssh import transport as ssh_transport
from gpucloud.providers.ssh.probe import REMOTE_ROOT

# Write stdin to "$p" atomically; the temporary name carries the shell's pid, so two writers of one
# object at once (two nodes, or a CLI and a node) each rename a whole file of their own.
PUT_P = 'mkdir -p "$(dirname "$p")" && cat >"$p.tmp.$$" && mv -f "$p.tmp.$$" "$p"'

ROOT_TOKEN = "@GPUCLOUD_REMOTE_ROOT@"
# Everything gpucloud writes on a host (code, inputs, logs, bootstrap, channel objects; the node
# it starts inherits it) is the user's alone: files 0600, folders 0700. Not for the driver install:
# sudo would apply it to the system files the packages write.
PRIVATE = "umask 077; "
# Remove a run's work and channel folders (`$RUN`) under the remote root `$R`, proven first: the run
# id is one plain name, and each folder's real path is exactly that folder under the real root (no
# `..`, no link on the way, the folder itself no link). Says `@refused PATH` or `@kept PATH`.
REMOVE_RUN = r"""
case "$RUN" in "" | . | .. | */*) echo "@refused work/$RUN" ;; *)
  root=$(cd "$R" 2>/dev/null && pwd -P)
  for p in "work/$RUN" "channel/runs/$RUN"; do
    [ -e "$R/$p" ] || [ -L "$R/$p" ] || continue
    if [ -n "$root" ] && [ ! -L "$R/$p" ] && [ "$(readlink -f -- "$R/$p")" = "$root/$p" ]; then
      rm -rf -- "${root:?}/$p" 2>/dev/null; [ -e "$root/$p" ] && echo "@kept $p"
    else echo "@refused $p"; fi
  done ;;
esac
true
"""


def removal_problem(word: str, path: str) -> str:
    """REMOVE_RUN's `@refused PATH` / `@kept PATH` as a sentence (PATH already made printable)."""
    if word == "@refused":
        return f"{path} not removed: it is not the run's own folder under the remote root (a link, or `..`)"
    return f"{path} could not be removed (rm failed)"


_MISSING = 3  # the remote `cat` exits with this when an object does not exist
_NOT_FILE = 4  # ... and with this when it is a link, a device, a FIFO or a folder
_roots: dict[str, str] = {}


def remote_root(host: str) -> str:
    """The host's absolute remote root (cached per process; one ssh call the first time)."""
    if host not in _roots:
        res = ssh_transport.run(
            ssh_transport.SshHost.parse(host), f'{PRIVATE}R={REMOTE_ROOT}; mkdir -p "$R" && cd "$R" && pwd'
        )
        _roots[host] = res.stdout.decode("utf-8", "replace").strip().splitlines()[-1]
    return _roots[host]


def fill_root(text: str, host: str) -> str:
    """Replace the placeholder in URLs (manifest, bootstrap) with this host's root."""
    return text.replace(ROOT_TOKEN, urllib.parse.quote(remote_root(host))) if ROOT_TOKEN in text else text


class SshChannel(Channel):
    """One run's hosts, in rank order (the run's `region` is the hosts joined with commas)."""

    def __init__(self, hosts: list[str]) -> None:
        self.hosts = list(hosts)
        self._relayed: set[tuple[str, int]] = set()

    # ---- where a key lives ------------------------------------------------------------------------
    def _targets(self, key: str) -> list[str]:
        parts = key.split("/")
        if len(parts) >= 3 and parts[0] == "runs" and parts[2].startswith("node-") and parts[2][5:].isdigit():
            rank = int(parts[2][5:])
            if rank < len(self.hosts):
                return [self.hosts[rank]]
        return list(self.hosts)

    @staticmethod
    def _path(key: str) -> str:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"key {key!r} leaves the channel root")
        return f'"$R"/channel/{shlex.quote(key)}'

    def _run(self, host: str, script: str, **kwargs: object) -> ssh_transport.Result:
        rooted = f"{PRIVATE}R={REMOTE_ROOT}; {script}"
        return ssh_transport.run(ssh_transport.SshHost.parse(host), rooted, **kwargs)  # type: ignore[arg-type]

    def node_url(self, url: str, rank: int) -> str:
        return fill_root(url, self.hosts[rank] if rank < len(self.hosts) else self.hosts[0])

    # ---- primitives -------------------------------------------------------------------------------
    def put_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        for host in self._targets(key):
            body = fill_root(data.decode(), host).encode() if ROOT_TOKEN.encode() in data else data
            self._run(host, f"p={path}; {PUT_P}", input=body)

    def put_file(self, key: str, path: Path) -> None:
        self.put_bytes(key, Path(path).read_bytes())

    def get_bytes(self, key: str, limit: int | None = None) -> bytes | None:
        """`cat` over ssh; with `limit`, only a regular file (no link, device or FIFO) of at most
        `limit` bytes, and no more than that crosses the connection."""
        host = self._targets(key)[0]
        if limit is None:  # whole objects (artifacts): the caller bounds what it accepts
            res = self._run(
                host, f"cat {self._path(key)} 2>/dev/null || exit {_MISSING}", check=False, max_output=sys.maxsize
            )
        else:
            res = self._run(
                host,
                f'f={self._path(key)}; [ -e "$f" ] || [ -L "$f" ] || exit {_MISSING}; '
                f'{{ [ -L "$f" ] || [ ! -f "$f" ]; }} && exit {_NOT_FILE}; '
                f'head -c {limit + 1} "$f"',
                check=False,
                max_output=limit + 1,
            )
            if res.returncode == _NOT_FILE:
                raise ObjectRefused(f"{host}: {key} is not a regular file (a link, device, FIFO or folder)")
            if res.returncode == 0 and len(res.stdout) > limit:
                raise ObjectRefused(f"{host}: {key} is larger than its cap of {limit} bytes")
        if res.returncode == _MISSING:
            return None
        if res.returncode != 0:
            raise ssh_transport.SshError(f"{host}: reading {key} failed: {res.stderr}")
        return res.stdout

    def get_to_file(self, key: str, path: Path) -> bool:
        """`cat` over ssh straight into `path` (an artifacts tarball may be many GB: never held in
        memory); False when the object does not exist."""
        host = self._targets(key)[0]
        with open(path, "wb") as sink:
            res = self._run(
                host,
                f"cat {self._path(key)} 2>/dev/null || exit {_MISSING}",
                check=False,
                max_output=sys.maxsize,
                sink=sink,
            )
        if res.returncode == _MISSING:
            return False
        if res.returncode != 0:
            raise ssh_transport.SshError(f"{host}: reading {key} failed: {res.stderr}")
        return True

    def url_get(self, key: str, expires: datetime) -> str:
        self._path(key)
        return f"file://{ROOT_TOKEN}/channel/{urllib.parse.quote(key)}"

    def url_put(self, key: str, expires: datetime) -> str:
        return self.url_get(key, expires)  # folders are made by `prepare` (one call per host)

    signs = True

    def claims(self, run_id: str, rank: int) -> list[tuple[str | None, bytes]]:
        """`<log folder>/claim-<fingerprint>` files on the node's host, in one ssh call."""
        folder = self._path(log_prefix(run_id, rank).rstrip("/"))
        res = self._run(
            self.hosts[rank],
            f"for f in {folder}/{channel_trust.CLAIM_PREFIX}*; do "
            '{ [ -f "$f" ] && [ ! -L "$f" ]; } || continue; '
            'printf "%s " "${f##*/}"; head -c 200 "$f" | head -n 1 | tr -d "\n"; echo; done',
            max_output=100 * 300,
        )
        out: list[tuple[str | None, bytes]] = []
        for line in res.stdout.decode("ascii", "replace").splitlines():
            name, _, key = line.partition(" ")
            out.append((name[len(channel_trust.CLAIM_PREFIX) :], key.encode()))
        return out

    def claims_url(self, run_id: str, rank: int, expires: datetime) -> str | None:
        """Node `rank`'s log folder, as a reading node finds it on its own host: the node lists its
        `claim-<fp>` files itself. On another host the relay copies them there (`relay_ready`)."""
        return self.url_get(log_prefix(run_id, rank), expires)

    def log_grant(self, run_id: str, rank: int, expires: datetime) -> list[str]:
        """The node's log folder on its host (made by `prepare`): parts without end."""
        return [f"log_dir {self.url_get(log_prefix(run_id, rank).rstrip('/'), expires)}"]

    def delete_prefix(self, prefix: str) -> None:
        for host in self._targets(prefix):
            self._run(host, f"rm -rf {self._path(prefix.rstrip('/'))}")

    # ---- run-level overrides ----------------------------------------------------------------------
    def prepare(
        self,
        run_id: str,
        num_nodes: int,
        deadline: datetime,
        *,
        checkpoint: bool = False,
        agent: bool = False,
        secrets: bool = False,
        keep: bool = False,
    ) -> list[str]:
        """Make every node's folders first (curl's file:// upload does not create them), and the
        run's checkpoint folder on each host when the job keeps checkpoints."""
        for rank in range(num_nodes):
            folders = [self._path(log_prefix(run_id, rank).rstrip("/"))]
            if checkpoint:
                folders.append(self._path(checkpoint_keys(run_id, 0)[0].rsplit("/", 1)[0]))
            self._run(self.hosts[rank], f"mkdir -p {' '.join(folders)}")
        return super().prepare(
            run_id, num_nodes, deadline, checkpoint=checkpoint, agent=agent, secrets=secrets, keep=keep
        )

    def read_status(self, run_id: str, rank: int = 0) -> dict | None:
        if rank == 0 and len(self.hosts) > 1:
            self.relay_ready(run_id)
        return super().read_status(run_id, rank)

    def relay_ready(self, run_id: str) -> None:
        """Multi-node barrier across hosts: copy each node's `ready` (its address) to the others,
        its claims first (the peers check the `ready` against them). A node signs its `ready` only
        once its claim is published, so a `ready` with no claim beside it waits for the next pass."""
        for rank, host in enumerate(self.hosts):
            if (run_id, rank) in self._relayed:
                continue
            key = f"{node_prefix(run_id, rank)}/ready"
            try:
                data = self.get_bytes(key, limit=SMALL_OBJECT_MAX)
            except ObjectRefused:  # not an address: the node's barrier times out and says so
                continue
            claims = self._claim_names(run_id, rank)
            if data is None or not claims:
                continue
            for peer in self.hosts:
                if peer != host:
                    folder = self._path(log_prefix(run_id, rank).rstrip("/"))
                    names = " ".join(f"{folder}/{channel_trust.CLAIM_PREFIX}{name}" for name in claims)
                    self._run(peer, f"mkdir -p {folder} && touch {names}")
                    self._run(
                        peer,
                        f"p={self._path(key)}; {PUT_P}",
                        input=data,
                    )
            self._relayed.add((run_id, rank))

    def _claim_names(self, run_id: str, rank: int) -> list[str]:
        """The fingerprints node `rank`'s claim files are named by (the host's listing is not
        trusted: only the 32 hex digits a peer's barrier reads are kept)."""
        names = {(name or "")[:32] for name, _ in self.claims(run_id, rank)}
        return sorted(name for name in names if re.fullmatch(r"[0-9a-f]{32}", name))


def start_relay(run_id: str, hosts: list[str], timeout_s: float) -> None:
    """Start the barrier relay for a multi-node run as its own session (it outlives the CLI)."""
    subprocess.Popen(
        [sys.executable, "-m", "gpucloud.providers.ssh.channel", run_id, ",".join(hosts), str(timeout_s)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def relay_until_done(run_id: str, hosts: list[str], timeout_s: float) -> None:
    """Copy `ready` objects between hosts until every node's is everywhere, the run's channel is
    gone (torn down) or the barrier timeout has passed."""
    channel, until = SshChannel(hosts), time.monotonic() + timeout_s
    while time.monotonic() < until and len(channel._relayed) < len(hosts):
        try:
            if channel.get_bytes(f"{node_prefix(run_id, 0)}/manifest", limit=SMALL_OBJECT_MAX) is None:
                return
            channel.relay_ready(run_id)
        except Exception:  # noqa: BLE001 - a dropped connection: try again next second
            pass
        time.sleep(1.0)


if __name__ == "__main__":
    relay_until_done(sys.argv[1], sys.argv[2].split(","), float(sys.argv[3]))
