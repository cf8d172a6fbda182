"""Per-run object URLs through which the VM pulls its code and pushes logs, status and artifacts.

The VM never holds cloud credentials and never accepts a connection: the CLI writes a manifest of
pre-signed URLs (one `KEY URL` line each) and hands the VM only that manifest's URL. Every backend
(file:// here, S3 in providers/aws/channel.py, Azure Blob in providers/azure/channel.py) provides
four primitives; the run-level protocol (layout, manifest, status, log parts) is written once, in
`Channel`.

Object layout (docs/INTERNALS.md, "Channel"):
    runs/<run_id>/code.tar.gz
    runs/<run_id>/node-<rank>/manifest | status.json | log/<000000..> | artifacts.tar.gz | ready
    (Azure: the node's log is one append blob, runs/<run_id>/node-<rank>/log.append)
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import BinaryIO

from gpucloud.channel import trust as channel_trust
from gpucloud.channel.extract import ArchiveLimits, ArtifactResult, extract_tar
from gpucloud.channel.trust import SMALL_OBJECT_MAX, ObjectRefused, read_capped
from gpucloud.channel.workdir import (  # noqa: F401  (re-exported: callers import them from here)
    ALWAYS_SKIP,
    DEFAULT_CODE_CAP,
    pack_workdir,
    workdir_files,
)
from gpucloud.vm import protocol

MiB = 1024 * 1024
# Pre-signed URLs outlive the run's deadline by this much, so the VM can still report a deadline
# (final status, last log part) and the CLI can still read everything back while tearing down.
URL_MARGIN = timedelta(hours=1)
# Largest log part (or appended block) the VM uploads: the CLI holds one part at a time, S3's POST
# policy caps a part's size at it, and Azure's Append Block takes up to 100 MiB from x-ms-version
# 2022-11-02 (docs/INTERNALS.md, "Channel"). The agent's job.json carries it (vm/agent_config.py).
LOG_PART_MAX = protocol.LOG_PART_MAX


def extract_artifacts(fileobj: BinaryIO, dest: Path, limits: ArchiveLimits | None = None) -> ArtifactResult:
    """Extract a node's artifacts tarball with gpucloud's own member walk (gpucloud/channel/extract.py)."""
    return extract_tar(fileobj, dest, limits)


def run_prefix(run_id: str) -> str:
    return f"runs/{run_id}"


def node_prefix(run_id: str, rank: int) -> str:
    return f"runs/{run_id}/node-{rank}"


CHECKPOINT_SLOTS = 2  # two versioned slots: an upload never touches the newest complete checkpoint


def checkpoint_keys(run_id: str, slot: int) -> tuple[str, str]:
    """(data, record) keys of one checkpoint slot. The record (`<seq> <sha256> <bytes> end`) is
    PUT after the data; a restore takes the newest slot whose data matches its record
    (docs/SPOT.md, "Checkpoints")."""
    base = f"{run_prefix(run_id)}/checkpoint/slot-{slot}"
    return f"{base}.tar.gz", f"{base}.sum"


def agent_key(run_id: str) -> str:
    """The VM agent archive of the run (the shim checks its SHA-256, rendered into user-data)."""
    return f"{run_prefix(run_id)}/agent.tar.gz"


def request_key(run_id: str, rank: int) -> str:
    """A kept machine's next job, which the run's owner signs (gpucloud/vm/agent/job_request.py)."""
    return f"{node_prefix(run_id, rank)}/request"


def notice_key(run_id: str, rank: int) -> str:
    """The simulated interruption notice `gpucloud preempt` writes; the VM's guard polls it."""
    return f"{node_prefix(run_id, rank)}/notice"


def secrets_key(run_id: str, rank: int) -> str:
    """The node's secrets, sealed to its claimed key (gpucloud/run/secrets.py); never plain text."""
    return f"{node_prefix(run_id, rank)}/secrets.sealed"


def log_key(run_id: str, rank: int, index: int) -> str:
    return f"{log_prefix(run_id, rank)}{protocol.log_part_name(index)}"


def log_prefix(run_id: str, rank: int) -> str:
    """The folder of a node's log parts (`log_key`), the one prefix its log grant covers."""
    return f"{node_prefix(run_id, rank)}/log/"


class Channel(ABC):
    """One object store, seen through per-run keys. Subclasses give the primitives."""

    # curl `-H` values the VM must send with every PUT (Azure Blob: "x-ms-blob-type: BlockBlob").
    put_headers: tuple[str, ...] = ()
    # Whether nodes sign their results (gpucloud/channel/trust.py): the backend can list a node's claims.
    signs = False

    def claims(self, run_id: str, rank: int) -> list[tuple[str | None, bytes]]:
        """(name, public key) of every claim on the node's results; a name is the key's fingerprint
        (an appended claim has none). Backends that sign override this."""
        return []

    def claim_grant(self, run_id: str, rank: int, expires: datetime) -> list[str]:
        """Manifest lines for publishing the node's key where its log grant cannot (Azure's log is
        one append blob: a second, `claim_append`); others publish it as `<log>/claim-<fp>`."""
        return []

    def claims_url(self, run_id: str, rank: int, expires: datetime) -> str | None:
        """A URL through which another node reads node `rank`'s claims and nothing else (manifest
        `claims_get <rank> URL`): a listing naming its `claim-<fp>` objects, or its appended claim
        lines. None where the backend has none; a run gets these lines only when every rank has one."""
        return None

    def node_url(self, url: str, rank: int) -> str:
        """`url` as node `rank` must use it. A URL that rides sealed (data grants) is opaque to
        `put_bytes`, so a backend whose URLs hold a per-host placeholder fills it here."""
        return url

    # ---- primitives -------------------------------------------------------------------------
    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Store `data` under `key` (overwrite)."""

    @abstractmethod
    def get_bytes(self, key: str, limit: int | None = None) -> bytes | None:
        """The object's bytes, or None when it does not exist. With `limit`, an object larger than
        `limit` bytes (or one that is not a plain object) raises ObjectRefused without being read."""

    @abstractmethod
    def url_get(self, key: str, expires: datetime) -> str:
        """A URL that curl can GET without credentials until `expires`."""

    @abstractmethod
    def url_put(self, key: str, expires: datetime) -> str:
        """A URL that `curl -T file` can PUT to without credentials until `expires`."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> None:
        """Delete every object whose key starts with `prefix` (a run's leftovers)."""

    @abstractmethod
    def log_grant(self, run_id: str, rank: int, expires: datetime) -> list[str]:
        """Manifest lines that let the node write its whole log until `expires`, whatever the
        run's length: `log_dir URL` (a folder: `curl -T part URL/<000000>`), `log_post URL` +
        `log_post_key PREFIX` + `log_post_field NAME VALUE`... (S3 presigned POST limited to the
        node's log prefix), or `log_append URL` (Azure: one append blob). docs/INTERNALS.md."""

    def put_file(self, key: str, path: Path) -> None:
        """Store a file; backends that can stream large files override this."""
        self.put_bytes(key, Path(path).read_bytes())

    # ---- run-level protocol -----------------------------------------------------------------
    def upload_code(self, run_id: str, tarball: Path) -> None:
        """Upload the packed workdir (pack_workdir) that every node fetches."""
        self.put_file(f"{run_prefix(run_id)}/code.tar.gz", tarball)

    def upload_agent(self, run_id: str, archive: bytes) -> None:
        """Upload the VM agent archive (gpucloud/vm/agent_pack.py) the nodes' shim fetches."""
        self.put_bytes(agent_key(run_id), archive)

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
        """Write each node's manifest; return each node's manifest GET URL (rank order).

        `deadline` is the run's hard end (UTC): URLs expire at deadline + URL_MARGIN, and the VM's
        watchdog fires at it (manifest line `deadline <epoch>`). The log is one grant per node
        (`log_grant`), so a manifest's size does not depend on the deadline. `checkpoint`: add the
        checkpoint slots' URLs (`ckpt_put|ckpt_get|ckpt_sum_put|ckpt_sum_get <slot> URL`). `agent`:
        add `agent_get URL`, the agent archive the shim fetches (`upload_agent`). `secrets`: add
        `secrets_get URL`, where the CLI puts the job's secrets sealed to the node's key (`secrets_key`).
        `keep`: add `request_get URL`, where a kept machine finds its next job (`request_key`).
        """
        if deadline.tzinfo is None:
            deadline = deadline.replace(tzinfo=UTC)
        expires = deadline + URL_MARGIN
        code_get = self.url_get(f"{run_prefix(run_id)}/code.tar.gz", expires)
        ready_get = [self.url_get(f"{node_prefix(run_id, r)}/ready", expires) for r in range(num_nodes)]
        # Multi-node: each node PUTs `done` when its bootstrap ends and reads its peers' (Azure: the
        # last node out deletes the run's resource group, the others only their own VM).
        done_get = (
            [self.url_get(f"{node_prefix(run_id, r)}/done", expires) for r in range(num_nodes)] if num_nodes > 1 else []
        )
        # Multi-node, signed: every rank checks a peer's signed `ready` against its claims (vm/agent/barrier.py).
        claims_get = [self.claims_url(run_id, r, expires) for r in range(num_nodes)] if self.signs else []
        readable = [url for url in claims_get if url] if num_nodes > 1 else []
        claims_lines = protocol.ranked_lines("claims_get", readable) if len(readable) == num_nodes else []
        urls = []
        for rank in range(num_nodes):
            base = node_prefix(run_id, rank)
            lines = [
                f"deadline {int(deadline.timestamp())}",
                f"code_get {code_get}",
                *([f"agent_get {self.url_get(agent_key(run_id), expires)}"] if agent else []),
                f"status_put {self.url_put(f'{base}/status.json', expires)}",
                f"artifacts_put {self.url_put(f'{base}/artifacts.tar.gz', expires)}",
                f"ready_put {self.url_put(f'{base}/ready', expires)}",
                *protocol.ranked_lines("ready_get", ready_get),
                *([f"done_put {self.url_put(f'{base}/done', expires)}"] if done_get else []),
                *protocol.ranked_lines("done_get", done_get),
                f"notice_get {self.url_get(notice_key(run_id, rank), expires)}",
                *([f"secrets_get {self.url_get(secrets_key(run_id, rank), expires)}"] if secrets else []),
                *([f"request_get {self.url_get(request_key(run_id, rank), expires)}"] if keep else []),
                *(self._checkpoint_lines(run_id, expires) if checkpoint else []),
                *self.log_grant(run_id, rank, expires),
                *([channel_trust.SIGN_LINE, *self.claim_grant(run_id, rank, expires)] if self.signs else []),
                *claims_lines,
            ]
            self.put_bytes(f"{base}/manifest", protocol.manifest_text(lines))
            urls.append(self.url_get(f"{base}/manifest", expires))
        return urls

    def _checkpoint_lines(self, run_id: str, expires: datetime) -> list[str]:
        lines = []
        for slot in range(CHECKPOINT_SLOTS):
            data, record = checkpoint_keys(run_id, slot)
            lines += [
                f"ckpt_put {slot} {self.url_put(data, expires)}",
                f"ckpt_get {slot} {self.url_get(data, expires)}",
                f"ckpt_sum_put {slot} {self.url_put(record, expires)}",
                f"ckpt_sum_get {slot} {self.url_get(record, expires)}",
            ]
        return lines

    def send_notice(self, run_id: str, rank: int, reason: str = "gpucloud preempt") -> None:
        """Write the simulated interruption notice of one node (its guard acts on it within seconds)."""
        self.put_bytes(notice_key(run_id, rank), protocol.notice_text(reason))

    def copy_run_to(self, run_id: str, dest: Channel) -> int:
        """Copy the run's code and checkpoint slots into another channel (a relaunch in another
        region or cloud); returns the bytes copied. Objects are held in memory one at a time."""
        keys = [f"{run_prefix(run_id)}/code.tar.gz"]
        keys += [k for slot in range(CHECKPOINT_SLOTS) for k in checkpoint_keys(run_id, slot)]
        copied = 0
        for key in keys:
            data = self.get_bytes(key)
            if data is not None:
                dest.put_bytes(key, data)
                copied += len(data)
        return copied

    def node_index(self, run_id: str, manifest_urls: list[str], deadline: datetime, *, agent: bool = False) -> str:
        """Write `runs/<run_id>/nodes` (`manifest <rank> <url>` per node, from `prepare`) and return
        its GET URL: the one URL in a user-data shared by all nodes (render with node_rank=None),
        from which each node picks its own manifest once it knows its rank."""
        if deadline.tzinfo is None:
            deadline = deadline.replace(tzinfo=UTC)
        key = f"{run_prefix(run_id)}/nodes"
        text = "".join(f"manifest {rank} {url}\n" for rank, url in enumerate(manifest_urls))
        if agent:  # the shim of a shared user-data reads the agent's URL from here
            text += f"agent_get {self.url_get(agent_key(run_id), deadline + URL_MARGIN)}\n"
        self.put_bytes(key, text.encode())
        return self.url_get(key, deadline + URL_MARGIN)

    def reset_nodes(self, run_id: str, num_nodes: int) -> None:
        """Delete every node object of the run (status, log parts, ready, done, artifacts) before a
        failover attempt re-uses this channel: a machine of the failed attempt may have booted and
        written a status that would otherwise be read as this attempt's. `prepare` writes the
        manifests again afterwards."""
        for rank in range(num_nodes):
            self.delete_prefix(f"{node_prefix(run_id, rank)}/")

    def read_status(self, run_id: str, rank: int = 0) -> dict | None:
        """The node's status.json, or None when absent (not booted yet) or caught mid-write."""
        key = f"{node_prefix(run_id, rank)}/status.json"
        try:
            raw = self.get_bytes(key, limit=SMALL_OBJECT_MAX)
        except ObjectRefused as exc:  # the run ends in error and is torn down; nothing of it is trusted
            return {
                "run_id": run_id,
                "rank": rank,
                "state": "error",
                "exit_code": ObjectRefused.exit_code,
                "stage": "done",
                "message": f"node {rank}'s status was refused: {exc.message}",
            }
        if not raw:
            return None
        try:
            doc = json.loads(raw.decode("utf-8", errors="replace"))
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        return (
            channel_trust.verified(self, run_id, rank, raw, doc)
            if channel_trust.signed_node(self, run_id, rank)
            else doc
        )

    def read_log_parts(self, run_id: str, rank: int = 0, start: int = 0) -> list[bytes]:
        """Every complete piece of the node's log from position `start` (`iter_log`)."""
        return [data for data, _ in self.iter_log(run_id, rank, start)]

    def iter_log(self, run_id: str, rank: int = 0, start: int = 0) -> Iterator[tuple[bytes, int]]:
        """(bytes, next position) of the node's complete log pieces from position `start`, one
        at a time, so a reader holds one piece (at most LOG_PART_MAX) in memory, not the log.

        Here a position is a part index: a part counts once status.json's `log_parts` covers it
        (the VM bumps that count only after the part's upload succeeded), so a reader never takes
        a half-written part and never skips one. An append-blob backend counts bytes instead.
        """
        status = self.read_status(run_id, rank)
        done = int(status.get("log_parts") or 0) if status else 0
        for i in range(start, done):
            try:
                data = self.get_bytes(log_key(run_id, rank, i), limit=LOG_PART_MAX)
            except ObjectRefused as exc:
                data = f"[gpucloud] log part {i} not read: {exc.message}\n".encode()
            if data is None:
                return
            yield data, i + 1

    def release_log_parts(self, run_id: str, rank: int, count: int) -> int:
        """The CLI's mirror holds this node's log up to `count` (its `iter_log` position: a part
        count on part stores) for good: a store on this machine's
        disk drops its copy (one copy of a log is kept). Remote stores keep theirs, so
        `gpucloud logs` works from another machine. Returns the bytes freed."""
        return 0

    def get_to_file(self, key: str, path: Path) -> bool:
        """Write the object into `path` (False when it does not exist). Backends stream it in
        chunks; this fallback holds it in memory once."""
        data = self.get_bytes(key)
        if data is None:
            return False
        Path(path).write_bytes(data)
        return True

    def download_artifacts(self, run_id: str, rank: int, dest_dir: Path) -> ArtifactResult | None:
        """Extract the node's artifacts tarball into dest_dir (created); None when there is none.

        The tarball is streamed to a temporary file and extracted member by member; what must not
        be extracted (links, devices, FIFOs, setuid bits, paths out of dest_dir) is skipped with
        one warning each, and the limits (extract.ArchiveLimits, from the environment) stop a bomb.
        """
        dest_dir = Path(dest_dir)
        dest_dir.mkdir(parents=True, exist_ok=True)
        limits = ArchiveLimits.from_env()
        with tempfile.TemporaryDirectory(prefix=".gpucloud-dl-", dir=dest_dir.parent) as tmp:
            local = Path(tmp) / "artifacts.tar.gz"
            if not self.get_to_file(f"{node_prefix(run_id, rank)}/artifacts.tar.gz", local):
                return None
            if channel_trust.signed_node(self, run_id, rank):
                with open(local, "rb") as fh:
                    digest = hashlib.file_digest(fh, "sha256").hexdigest()
                if why := channel_trust.artifacts_problem(self.read_status(run_id, rank), digest, rank):
                    return ArtifactResult(dest=dest_dir, warnings=[why])
            with open(local, "rb") as fh:
                return extract_artifacts(fh, dest_dir, limits)


class FileChannel(Channel):
    """The local provider's store: a folder, with file:// URLs that curl reads and writes."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root != path and self.root not in path.parents:
            raise ValueError(f"key {key!r} leaves the channel root")
        return path

    def put_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)  # readers never see half an object written by the CLI

    def get_bytes(self, key: str, limit: int | None = None) -> bytes | None:
        try:
            path = self._path(key)
        except ValueError:  # a link the VM made that leaves the store (to /dev/zero, say)
            raise ObjectRefused(f"{key} is not a regular file (a link out of the channel store)") from None
        return read_capped(path, limit, key)

    def get_to_file(self, key: str, path: Path) -> bool:
        try:
            with open(self._path(key), "rb") as src, open(path, "wb") as out:
                shutil.copyfileobj(src, out, 1024 * 1024)
        except (FileNotFoundError, IsADirectoryError):
            return False
        return True

    def url_get(self, key: str, expires: datetime) -> str:
        return self._path(key).as_uri()

    def url_put(self, key: str, expires: datetime) -> str:
        """curl's file:// upload creates the file but not its folder: create the folder now."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.as_uri()

    signs = True

    def claims(self, run_id: str, rank: int) -> list[tuple[str | None, bytes]]:
        """`<log folder>/claim-<fingerprint>` files (regular files only, each capped)."""
        folder = self._path(log_prefix(run_id, rank))
        out: list[tuple[str | None, bytes]] = []
        for path in sorted(folder.glob(channel_trust.CLAIM_PREFIX + "*")) if folder.is_dir() else []:
            data = read_capped(path, channel_trust.CLAIM_MAX, path.name)
            if data is not None:
                out.append((path.name[len(channel_trust.CLAIM_PREFIX) :], data))
        return out

    def claims_url(self, run_id: str, rank: int, expires: datetime) -> str | None:
        """The node's log folder: the reading node lists its `claim-<fp>` files itself (curl's
        file:// GET of a folder says nothing; a file channel is on the node's own filesystem)."""
        return self._path(log_prefix(run_id, rank)).as_uri() + "/"

    def log_grant(self, run_id: str, rank: int, expires: datetime) -> list[str]:
        """The node's log folder, created now (curl's file:// upload does not create folders)."""
        path = self._path(log_prefix(run_id, rank))
        path.mkdir(parents=True, exist_ok=True)
        return [f"log_dir {path.as_uri()}"]

    def release_log_parts(self, run_id: str, rank: int, count: int) -> int:
        freed = 0
        for index in range(count):
            path = self._path(log_key(run_id, rank, index))
            try:
                freed += path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                continue
        return freed

    def delete_prefix(self, prefix: str) -> None:
        path = self._path(prefix)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()


def iter_manifest(text: str) -> Iterable[tuple[str, str]]:
    """(key, rest) pairs of a manifest, as the VM reads them (gpucloud/vm/protocol.py)."""
    return protocol.iter_manifest(text)
