"""Whose word a run takes: the machine's own key, not the channel's write grants.

Why: the write grants (status, log, artifacts) travel in the manifest, and the manifest's URL in
user-data, which anyone allowed to read the VM's attributes can read (AWS `ec2:DescribeInstanceAttribute`,
part of ReadOnlyAccess; the Azure VM model's custom data). So holding a grant proves nothing. At
boot the bootstrap makes an Ed25519 key pair that never leaves the machine, publishes the public
key as its node's *claim* (through the node's append-only log grant: a claim can be added, never
replaced or removed), and signs every status.json it writes; the final status carries the SHA-256
of the artifacts tarball it uploaded. The CLI takes a status only when exactly one key claims the
node and that key signed it, and extracts artifacts only when their hash is the signed one. Two
claims (a reader that fetched the manifest and claimed too) or a status not signed by the claimed
key end the run in `error` (exit 65) and tear it down: the run fails closed instead of trusting
either side. docs/SECURITY.md, "Channel grants and user-data", says what this does not cover.
"""

from __future__ import annotations

import base64
import binascii
import math
import os
import stat
from pathlib import Path
from typing import Any

from gpucloud.errors import UserError
from gpucloud.vm import protocol

MiB = 1024 * 1024
# What the CLI reads of a small object the VM writes (status.json, ready, done, manifest): a status is
# under 4 KiB; a bigger one comes from a broken or hostile writer and is refused, never read whole.
SMALL_OBJECT_MAX = 1 * MiB
FINAL_STATES = protocol.FINAL_STATES  # status.json states that end a node
SIGN_LINE = protocol.SIGN_LINE  # the manifest line that makes a node's results need its signature
CLAIM_PREFIX = "claim-"  # file/ssh/S3: claim objects `<node>/log/claim-<fingerprint>`
CLAIM_MAX = 1024  # bytes of one claim the CLI reads
CLAIMS_MAX = 64 * 1024  # bytes of all claims of a node (an append blob on Azure)
REFUSED_EXIT = 65  # EX_DATAERR: what the machine(s) wrote is not usable
EXIT_MAX = 255  # a process's exit status is one byte: anything else would wrap (256 -> 0) on the way out
TIME_MAX = 2**40  # seconds (epoch or durations): past year 36000, and exact as a float
COUNT_MAX = 2**53  # log parts, log bytes, input files and bytes: what a float still holds exactly
GPU_DEPTH_MAX = 4  # the GPU sampler's summary nests a dict, a list (`now`, `points`) and its rows
IGNORED = "ignored"  # a checked status's notes: informational fields it dropped, one line each
STATES = (*protocol.PROGRESS_STATES, *FINAL_STATES)


class ObjectRefused(UserError):
    """A channel object the CLI will not read: larger than its cap, or not a regular file (a link out
    of the store, a device such as /dev/zero). The caller names it and goes on without it."""

    exit_code = REFUSED_EXIT


def read_capped(path: Path, limit: int | None, what: str) -> bytes | None:
    """A file's bytes, None when absent; with `limit`, only a regular file of at most `limit` bytes
    (checked on the open descriptor, so a swap to /dev/zero between check and read changes nothing)."""
    try:  # O_NONBLOCK: opening a FIFO must not wait for a writer
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as fh:
            st = os.fstat(fh.fileno())
            if limit is None:
                return fh.read()
            if not stat.S_ISREG(st.st_mode):
                raise ObjectRefused(f"{what} is not a regular file (a device, FIFO or folder)")
            data = fh.read(limit + 1)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    if len(data) > limit:
        raise ObjectRefused(f"{what} is larger than its cap of {limit} bytes")
    return data


fingerprint = protocol.fingerprint  # the claim's name: first 32 hex digits of SHA-256 over the base64 text


def claimed_key(claims: list[tuple[str | None, bytes]]) -> tuple[str | None, str | None]:
    """(the one public key claiming the node, or None when none does yet; a problem, or None).
    `claims` are (name, content): a named claim must be named by its key's fingerprint."""
    keys: set[str] = set()
    for name, content in claims:
        text = content.decode("ascii", "replace").strip()
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != 32:
            return None, f"a claim on the node's results is not an Ed25519 public key ({name or 'appended line'})"
        if name is not None and name != fingerprint(text):
            return None, f"claim {name} holds another machine's key"
        keys.add(text)
    if len(keys) > 1:
        return None, (
            f"{len(keys)} different keys claim the node's results (someone who could read the VM's "
            "user-data wrote to its channel)"
        )
    return (next(iter(keys)) if keys else None), None


def signed_by(pub_b64: str, raw: bytes) -> bool:
    """Whether status.json bytes `raw` end with `,"sig":"<base64>"}` over the rest, signed by the key."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    split = protocol.split_signature(raw)
    if split is None:
        return False
    try:
        sig = base64.b64decode(split[1], validate=True)
        Ed25519PublicKey.from_public_bytes(base64.b64decode(pub_b64)).verify(sig, split[0])
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True


def untrusted(run_id: str, rank: int, why: str) -> dict[str, object]:
    """The final status that stands in for results the CLI will not take: the run ends in error."""
    return _stand_in(run_id, rank, f"node {rank}'s results are not trusted: {why}; the run was stopped")


def _stand_in(run_id: str, rank: int, message: str) -> dict[str, object]:
    return {
        "run_id": run_id,
        "rank": rank,
        "state": "error",
        "exit_code": REFUSED_EXIT,
        "stage": "done",
        "message": message,
    }


def artifacts_problem(status: dict | None, digest: str, rank: int) -> str | None:
    """Why the node's artifacts tarball (its SHA-256 hex `digest`) is refused (not the hash the node
    signed), or None."""
    want = (status or {}).get("artifacts_sha256")
    if not isinstance(want, str) or len(want) != 64:
        return f"node {rank}'s artifacts refused: no signed hash for them in its final status"
    if digest != want:
        return f"node {rank}'s artifacts refused: they are not the ones its machine uploaded (hash differs)"
    return None


def signed_node(channel: Any, run_id: str, rank: int) -> bool:
    """Whether the node's manifest (written by the CLI; no grant lets anyone else write it) asks the
    node to sign: then only its signed word counts. Cached on the channel object."""
    if not channel.signs:
        return False
    known = channel.__dict__.setdefault("_signed_nodes", {})
    if (run_id, rank) not in known:
        try:
            manifest = channel.get_bytes(f"runs/{run_id}/node-{rank}/manifest", limit=SMALL_OBJECT_MAX)
        except ObjectRefused:
            manifest = b""
        if manifest is None:
            return False
        known[(run_id, rank)] = f"\n{SIGN_LINE}\n" in "\n" + manifest.decode("utf-8", "replace")
    return bool(known[(run_id, rank)])


def verified(channel: Any, run_id: str, rank: int, raw: bytes, doc: dict) -> dict | None:
    """A final status only if the node's one claimed key signed it (the claims are listed each time);
    an `error` status when two keys claim the node or the claimed key did not sign; None (not taken,
    poll again) while no key claims it. Progress statuses (booting, running) are not signed: they
    decide nothing. Either kind is returned `checked` (every field typed and in range)."""
    if doc.get("state") not in FINAL_STATES:
        return checked(doc, run_id, rank)
    try:
        key, problem = claimed_key(channel.claims(run_id, rank))
    except ObjectRefused as exc:
        key, problem = None, exc.message
    if problem:
        return untrusted(run_id, rank, problem)
    if key is None:
        return None
    if not signed_by(key, raw):
        return untrusted(run_id, rank, "its status.json is not signed by the key its machine published")
    return checked(doc, run_id, rank)


def _number(value: object, low: float, high: float) -> bool:
    """A JSON number (not a bool, which Python counts as an int) that is finite and in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return (math.isfinite(value) if isinstance(value, float) else True) and low <= value <= high


def _stage_entry(info: object) -> bool:
    if not isinstance(info, dict):
        return False
    times = all(info.get(k) is None or _number(info.get(k), 0, TIME_MAX) for k in ("start", "end"))
    return times and (info.get("ok") is None or isinstance(info.get("ok"), bool))


def _gpu_tree(value: object, depth: int = 0) -> bool:
    """The sampler's summary holds numbers and nulls in dicts and lists, nothing else."""
    if value is None or _number(value, -TIME_MAX, TIME_MAX):
        return True
    if depth >= GPU_DEPTH_MAX:
        return False
    if isinstance(value, dict):
        return all(isinstance(k, str) and _gpu_tree(v, depth + 1) for k, v in value.items())
    if isinstance(value, list):
        return all(_gpu_tree(v, depth + 1) for v in value)
    return False


def _gpu_rows(gpu: dict) -> bool:
    """`now` rows are (util, used, total, power, temp); `series.points` rows (t, util, mem)."""
    now, series = gpu.get("now"), gpu.get("series")
    points = series.get("points") if isinstance(series, dict) else None
    rows_ok = all(isinstance(r, list) and len(r) == 5 for r in now) if isinstance(now, list) else now is None
    points_ok = all(isinstance(p, list) and len(p) == 3 and None not in p for p in points) if points else True
    return rows_ok and points_ok and (series is None or isinstance(series, dict))


def _exit_problem(state: str, code: object) -> str | None:
    """Why a final status's exit code is refused: not null or an integer in 0..255 (or not 0 for a
    success). A wrong one must never reach sys.exit, where 256 would be read as 0."""
    if code is None and state != "succeeded":
        return None
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= EXIT_MAX:
        return f"`exit_code` is {_brief(code)}, not an integer from 0 to {EXIT_MAX}"
    if state == "succeeded" and code != 0:
        return f"`exit_code` is {code} in a status that says the job succeeded"
    return None


def _brief(value: object) -> str:
    """A short, printable picture of a refused value (its type and first characters)."""
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}".encode("ascii", "replace").decode()


def _informational(doc: dict, out: dict, notes: list[str]) -> None:
    """The fields that only inform (what is shown, when a machine looks stale): a bad one is dropped
    with a note, the run goes on."""
    checks = {
        "stage": lambda v: isinstance(v, str) and v in protocol.STAGES,
        "heartbeat": lambda v: _number(v, 0, TIME_MAX),
        "message": lambda v: isinstance(v, str),
        "artifacts_sha256": lambda v: isinstance(v, str),
        "gpu": lambda v: isinstance(v, dict) and _gpu_tree(v) and _gpu_rows(v),
        "inputs": lambda v: isinstance(v, dict) and all(_number(n, 0, COUNT_MAX) for n in v.values()),
        "job": lambda v: isinstance(v, int) and _number(v, 0, COUNT_MAX),
        "kept": lambda v: isinstance(v, dict) and all(_number(n, 0, TIME_MAX) for n in v.values()),
    }
    for name, ok in checks.items():
        if name in doc and doc[name] is not None:
            if ok(doc[name]):
                out[name] = doc[name]
            else:
                notes.append(f"`{name}` ignored ({_brief(doc[name])})")
    stages = doc.get("stages")
    if isinstance(stages, dict):
        good = {k: v for k, v in stages.items() if k in protocol.STAGES and _stage_entry(v)}
        if len(good) != len(stages):
            notes.append(f"{len(stages) - len(good)} entry(ies) of `stages` ignored (unknown stage or bad times)")
        out["stages"] = good
    elif stages is not None:
        notes.append(f"`stages` ignored ({_brief(stages)})")


def checked(doc: dict, run_id: str, rank: int) -> dict:
    """The status.json document with every field the CLI reads checked for type and range.

    A field that decides something (`state`; `exit_code` in a final status; `log_parts` and
    `log_bytes`, which say how much of the log to read) that is wrong ends the run in `error`,
    exit 65, naming the field: a job or a reader of the channel must not turn a failure into
    success or make the CLI crash. A wrong informational field is dropped and named in the
    IGNORED notes; unknown fields are dropped."""
    where = f"node {rank}'s status.json"
    state = doc.get("state")
    if not isinstance(state, str) or state not in STATES:
        return refused_field(run_id, rank, f"`state` is {_brief(state)}, not one of {', '.join(STATES)}")
    for name in ("log_parts", "log_bytes"):
        value = doc.get(name)
        if value is not None and not (_number(value, 0, COUNT_MAX) and isinstance(value, int)):
            return refused_field(run_id, rank, f"`{name}` is {_brief(value)}, not a count from 0 to {COUNT_MAX}")
    out: dict = {"run_id": run_id, "rank": rank, "state": state}
    for name in ("log_parts", "log_bytes"):
        if doc.get(name) is not None:
            out[name] = doc[name]
    if state in FINAL_STATES:
        if problem := _exit_problem(state, doc.get("exit_code")):
            return refused_field(run_id, rank, problem)
        out["exit_code"] = doc.get("exit_code")
    notes: list[str] = []
    _informational(doc, out, notes)
    if notes:
        out[IGNORED] = [f"{where}: {note}" for note in notes]
    return out


def refused_field(run_id: str, rank: int, why: str) -> dict[str, object]:
    """The final status that stands in for a status.json with a field the CLI refuses to read."""
    return _stand_in(run_id, rank, f"node {rank}'s status.json was refused: {why}; the run was stopped")
