"""The wire format between the CLI and a node, defined once: the manifest, the status document,
the log grant, the checkpoint record and the preemption notice (docs/INTERNALS.md, "Channel").

Both sides import this module: the CLI (gpucloud/channel/run_objects.py writes manifests and reads statuses)
and the VM agent (gpucloud/vm/agent/, which the CLI ships to the node). So it is stdlib only, with
Python >= 3.8 syntax (Ubuntu 20.04 hosts), and imports nothing else of gpucloud.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

MiB = 1024 * 1024
# Largest log part (or appended block): the CLI holds one part at a time, S3's POST policy caps a
# part at it, Azure's Append Block takes up to 100 MiB from x-ms-version 2022-11-02.
LOG_PART_MAX = 16 * MiB
# An append blob takes 50,000 blocks: parts are paced to last 45,000 until the deadline, 5,000 kept
# for the final flush.
APPEND_PACED_BLOCKS = 45000
APPEND_RESERVED_BLOCKS = 5000
UNLIMITED_PARTS = 999999999
AZURE_STORAGE_VERSION = "2022-11-02"

SIGN_LINE = "sign ed25519"  # the manifest line that makes a node's results need its signature
SIG_FIELD = b',"sig":"'

# Every stage a node reports, in the order it runs, with the timeline group its time is shown under
# (gpucloud/ui/timeline.py). A new stage is one line here: the CLI then accepts it in a status
# document, orders it and shows it; the agent opens it by this name.
STAGE_GROUPS: Tuple[Tuple[str, str], ...] = (
    ("preflight", "boot"),
    ("watchdog", "boot"),
    ("stack", "stack"),
    ("gpu_verify", "stack"),
    ("fetch_code", "fetch"),
    ("inputs", "inputs"),
    ("container_pull", "pull"),
    ("setup", "setup"),
    ("barrier", "setup"),
    ("run", "run"),
    ("outputs", "outputs"),
    ("artifacts", "artifacts"),
)
DONE_STAGE = "done"  # the end marker the final status carries: no time of its own, so in no group
STAGES = tuple(name for name, _ in STAGE_GROUPS) + (DONE_STAGE,)
PROGRESS_STATES = ("booting", "running")
FINAL_STATES = ("succeeded", "failed", "deadline", "error", "preempted")

# Manifest keys that carry one URL, keys that carry `<rank|slot> URL`, and the log grant's keys.
URL_KEYS = (
    "code_get",
    "status_put",
    "artifacts_put",
    "ready_put",
    "done_put",
    "notice_get",
    "claim_append",
    "agent_get",
    "secrets_get",
    "request_get",  # a kept machine's next job, signed by the run's owner (vm/agent/keep.py)
)
# `claims_get <rank> URL`: what a node reads of a peer's claims (its claim objects' listing, or its
# appended claim lines) to check the peer's signed `ready` (gpucloud/vm/agent/barrier.py).
RANKED_KEYS = ("ready_get", "done_get", "ckpt_put", "ckpt_get", "ckpt_sum_put", "ckpt_sum_get", "claims_get")


def iter_manifest(text: str) -> Iterator[Tuple[str, str]]:
    """(key, rest) pairs of a manifest, one `KEY REST` a line (blank lines skipped)."""
    for line in text.splitlines():
        if line.strip():
            key, _, rest = line.partition(" ")
            yield key, rest


def manifest_text(lines: Iterable[str]) -> bytes:
    """The manifest's bytes: one line each, newline-terminated."""
    return ("\n".join(lines) + "\n").encode()


def ranked_lines(key: str, urls: Sequence[str]) -> List[str]:
    """`key <i> URL` for each URL in order (ready_get, done_get, checkpoint slots)."""
    return [f"{key} {i} {url}" for i, url in enumerate(urls)]


def log_part_name(index: int) -> str:
    """A log part's name under the node's log prefix (or folder): six digits."""
    return f"{index:06d}"


@dataclass
class LogGrant:
    """How the node writes its log (one of three styles, by its backend).

    dir: a folder URL, part i is PUT to `URL/<i:06d>` (file, ssh).
    post: one presigned S3 POST: the fields, then `key=PREFIX<i:06d>`, then the file (last).
    append: an Azure append blob SAS (`sp=a`): Append Block at a byte offset.
    """

    style: str = ""
    url: str = ""
    key_prefix: str = ""
    fields: List[Tuple[str, str]] = field(default_factory=list)

    @property
    def max_parts(self) -> int:
        """How many parts the pump paces itself for until the deadline."""
        return APPEND_PACED_BLOCKS if self.style == "append" else UNLIMITED_PARTS


@dataclass
class Manifest:
    """A node's manifest, parsed: what the VM may read and write, and its deadline."""

    deadline: Optional[int] = None
    urls: Dict[str, str] = field(default_factory=dict)
    ranked: Dict[str, Dict[int, str]] = field(default_factory=dict)
    log: LogGrant = field(default_factory=LogGrant)
    signs: bool = False
    identity: str = ""  # `node_identity imds`: the node signs its S3 requests itself (agent/sigv4.py)
    nodes: Dict[int, str] = field(default_factory=dict)  # a node index: `manifest <rank> URL`

    def url(self, key: str) -> str:
        return self.urls.get(key, "")

    def ranked_url(self, key: str, index: int) -> str:
        return self.ranked.get(key, {}).get(index, "")


def parse_manifest(text: str) -> Manifest:
    """Parse a manifest (or a node index). Unknown keys are ignored, so an older agent reads a newer
    manifest; a malformed ranked line is skipped (the agent then finds that URL missing)."""
    m = Manifest()
    for key, rest in iter_manifest(text):
        if key == "deadline":
            m.deadline = int(rest) if rest.strip().isdigit() else None
        elif key in URL_KEYS:
            m.urls[key] = rest
        elif key in RANKED_KEYS or key == "manifest":
            idx, _, url = rest.partition(" ")
            if idx.isdigit():
                if key == "manifest":
                    m.nodes[int(idx)] = url
                else:
                    m.ranked.setdefault(key, {})[int(idx)] = url
        elif key == "log_dir":
            m.log.style, m.log.url = "dir", rest
        elif key == "log_post":
            m.log.style, m.log.url = "post", rest
        elif key == "log_post_key":
            m.log.key_prefix = rest
        elif key == "log_post_field":
            name, _, value = rest.partition(" ")
            m.log.fields.append((name, value))
        elif key == "log_append":
            m.log.style, m.log.url = "append", rest
        elif key == "sign":
            m.signs = rest == SIGN_LINE.split(" ", 1)[1]
        elif key == "node_identity":
            m.identity = rest.strip()
    return m


def status_document(
    *,
    run_id: str,
    rank: int,
    state: str,
    stage: str,
    stages: Mapping[str, Mapping[str, object]],
    heartbeat: int,
    exit_code: Optional[int],
    message: str,
    log_parts: int,
    log_bytes: int,
    artifacts_sha256: str = "",
    gpu: Optional[Mapping[str, object]] = None,
    inputs: Optional[Mapping[str, int]] = None,
    job: int = 0,
    kept: Optional[Mapping[str, int]] = None,
) -> bytes:
    """status.json's bytes, fields in their fixed order, compact, newline-terminated. `stages` in
    STAGES order; each `{"start": epoch, "end": epoch|null, "ok": bool|null}`. `gpu`, when the node
    samples its GPUs, is the sampler's summary (gpucloud/vm/agent/gpu_usage.py). `inputs`, while the
    node copies its inputs, is the copy's progress (files, of, bytes, of_bytes)."""
    ordered = {s: dict(stages[s]) for s in STAGES if s in stages}
    doc = {
        "run_id": run_id,
        "rank": rank,
        "state": state,
        "stage": stage,
        "stages": ordered,
        "heartbeat": heartbeat,
        "exit_code": exit_code,
        "message": _printable(message),
        "log_parts": log_parts,
        "log_bytes": log_bytes,
        "artifacts_sha256": artifacts_sha256,
    }
    if gpu:
        doc["gpu"] = dict(gpu)
    if inputs:
        doc["inputs"] = {k: int(v) for k, v in inputs.items()}
    if job:  # a kept machine's later job (`gpucloud exec`): its number
        doc["job"] = int(job)
    if kept:  # the job ended and the machine waits for the next: {"since", "until"} (epochs)
        doc["kept"] = {k: int(v) for k, v in kept.items()}
    return (json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def _printable(text: str) -> str:
    """Control characters other than newline, CR and tab become spaces (as the bash jstr did)."""
    return "".join(c if c in "\n\r\t" or (ord(c) >= 32 and ord(c) != 127) else " " for c in text)


def is_final(doc: Mapping[str, object]) -> bool:
    return doc.get("state") in FINAL_STATES


def signed_status(raw: bytes, sig_b64: str) -> bytes:
    """The status with its signature: `...,"sig":"<base64>"}` + newline, over `raw` (`...}` + newline)."""
    return raw.rstrip(b"\n")[:-1] + SIG_FIELD + sig_b64.encode() + b'"}\n'


def split_signature(raw: bytes) -> Optional[Tuple[bytes, str]]:
    """(signed bytes, base64 signature) of a signed status, or None when it does not end in one
    signature field (the CLI's check of a node's signature reads it through this one parser)."""
    at = raw.rfind(SIG_FIELD)
    end = raw.find(b'"', at + len(SIG_FIELD)) if at >= 0 else -1
    if at < 0 or end < 0 or raw[end:].strip() != b'"}':
        return None
    return raw[:at] + b"}\n", raw[at + len(SIG_FIELD) : end].decode("ascii", "replace")


def fingerprint(pub_b64: str) -> str:
    """A node key's name in its claims: the first 32 hex digits of SHA-256 over its base64 text."""
    return hashlib.sha256(pub_b64.encode()).hexdigest()[:32]


def claim_name(pub_b64: str) -> str:
    """The object a node writes under its log grant to claim itself (file, ssh, S3)."""
    return f"claim-{fingerprint(pub_b64)}"


def ready_signed_bytes(run_id: str, rank: int, address: str) -> bytes:
    """What a node signs in its `ready` object: the run, its rank and its address (a signed `ready`
    cannot be replayed for another rank or run)."""
    return f"gpucloud-ready 1\n{run_id}\n{rank}\n{address}\n".encode()


def ready_text(address: str, pub_b64: str = "", sig_b64: str = "") -> bytes:
    """A node's `ready` object: its address on the first line (what older readers take), then
    `key <public key>` and `sig <signature over ready_signed_bytes>` when the node signs."""
    lines = [address] + ([f"key {pub_b64}", f"sig {sig_b64}"] if pub_b64 and sig_b64 else [])
    return ("\n".join(lines) + "\n").encode()


def parse_ready(body: bytes) -> Tuple[str, str, str]:
    """(address, public key, signature) of a `ready` object; '' for what it lacks."""
    lines = body.decode("utf-8", "replace").strip().splitlines()
    address = lines[0].strip() if lines else ""
    fields = dict(line.strip().partition(" ")[::2] for line in lines[1:])
    return address, fields.get("key", "").strip(), fields.get("sig", "").strip()


def claim_fingerprints(body: bytes) -> List[str]:
    """The fingerprints of the claims in a `claims_get` answer, sorted, each once: an appended claim
    line holds a base64 public key; a listing names claim objects `claim-<fingerprint>` (whatever
    else it holds). Anything that looks like a claim counts, so a stranger's claim is never missed."""
    text = body.decode("utf-8", "replace")
    found = set(re.findall(r"claim-([0-9a-f]{32})(?![0-9a-f])", text))
    for line in text.split():
        if len(line) == 44 and re.fullmatch(r"[A-Za-z0-9+/]{43}=", line):
            found.add(fingerprint(line))
    return sorted(found)


def checkpoint_record(seq: int, sha256: str, size: int) -> bytes:
    """A checkpoint slot's record, written after its data: `<seq> <sha256> <bytes> end`."""
    return f"{seq} {sha256} {size} end\n".encode()


@dataclass
class CheckpointRecord:
    seq: int
    sha256: str
    size: int


def parse_checkpoint_record(text: str) -> Optional[CheckpointRecord]:
    """The record, or None when incomplete (no `end`: its upload was cut short) or malformed."""
    parts = text.split()
    if len(parts) != 4 or parts[3] != "end" or not parts[0].isdigit() or not parts[2].isdigit():
        return None
    return CheckpointRecord(int(parts[0]), parts[1], int(parts[2]))


def notice_text(reason: str = "gpucloud preempt") -> bytes:
    """The simulated interruption notice `gpucloud preempt` writes to a node's `notice` object."""
    return f"{reason}\n".encode()


def notice_reason(body: bytes) -> str:
    """Why the node is told to stop, as its final status names it."""
    return f"simulated notice ({body.decode('utf-8', 'replace').strip() or 'gpucloud preempt'})"
