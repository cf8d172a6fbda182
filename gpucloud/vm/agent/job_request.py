"""A job for a kept machine (`gpucloud exec`, `run --on`): what the CLI writes to the node's
`request` object and the node takes. The channel is writable by more than the run's owner (a
grant, a bucket policy), so the node runs a request only when the run's owner key signed it: its
public half is in job.json, inside the agent archive whose SHA-256 the user-data pins, and its
private half never leaves the caller's GPUCLOUD_HOME (docs/SECURITY.md, "Kept machines").

Wire form: the request's JSON (sorted keys, compact) + newline + `sig <base64 Ed25519 signature
over the JSON's bytes>` + newline. A request is taken once: its `seq` must be above the last one
taken, so a replayed request is ignored. `own_secrets` (`run --on`): the job brings its own secrets and
data grants, sealed to the node's key in the object `secrets_get` names (its SHA-256 in
`secrets_sha256`), or none at all; without it (`exec`) the run's stay. Stdlib only, Python >= 3.8
syntax (the CLI imports it too).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List

REQUEST_MAX = 256 * 1024
TEXT_MAX = 64 * 1024
SIG_PREFIX = b"\nsig "


class Refused(ValueError):
    """A request the node will not run (malformed, not for this node, or not signed by the owner)."""


def request_body(doc: Dict[str, Any]) -> bytes:
    """The bytes the owner signs."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def signed_request(body: bytes, sig_b64: str) -> bytes:
    return body + SIG_PREFIX + sig_b64.encode("ascii") + b"\n"


def peek_seq(raw: bytes) -> int:
    """The request's seq without checking anything (0 when unreadable): a request already taken is
    skipped before any signature is checked."""
    body = raw.split(SIG_PREFIX, 1)[0]
    try:
        seq = json.loads(body.decode("utf-8")).get("seq")
    except (ValueError, AttributeError):
        return 0
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else 0


def _strings(value: Any, what: str) -> List[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and 0 < len(v) <= 4096 for v in value):
        raise Refused(f"`{what}` is not a list of paths")
    return list(value)


def _text(doc: Dict[str, Any], name: str) -> str:
    value = doc.get(name, "")
    if not isinstance(value, str) or len(value) > TEXT_MAX:
        raise Refused(f"`{name}` is not text of at most {TEXT_MAX} characters")
    return value


def parse(
    raw: bytes,
    *,
    run_id: str,
    rank: int,
    owner_key: str,
    last_seq: int,
    verify: Callable[[str, bytes, str], bool],
) -> Dict[str, Any]:
    """The request's fields, checked; raises Refused naming why."""
    if len(raw) > REQUEST_MAX or SIG_PREFIX not in raw:
        raise Refused("no signature")
    body, sig = raw.rsplit(SIG_PREFIX, 1)
    if not owner_key or not verify(owner_key, body, sig.strip().decode("ascii", "replace")):
        raise Refused("not signed by the run's owner key")
    try:
        doc = json.loads(body.decode("utf-8"))
    except ValueError as exc:
        raise Refused(f"not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("run_id") != run_id or doc.get("rank") != rank:
        raise Refused("for another run or node")
    seq = doc.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq <= last_seq:
        raise Refused(f"seq {seq!r} is not above the last job taken ({last_seq})")
    env = doc.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise Refused("`env` is not a mapping of names to text")
    names = ("code_get", "code_sha256", "setup", "run", "secrets_get", "secrets_sha256")
    out: Dict[str, Any] = {name: _text(doc, name) for name in names}
    if not out["run"]:
        raise Refused("no `run` command")
    own = doc.get("own_secrets", False)
    if not isinstance(own, bool) or (out["secrets_get"] and not (own and len(out["secrets_sha256"]) == 64)):
        raise Refused("`own_secrets`/`secrets_sha256` do not go with `secrets_get`")
    out["own_secrets"] = own
    out.update(seq=seq, env=env, delete=_strings(doc.get("delete", []), "delete"))
    out["artifacts"] = _strings(doc.get("artifacts", []), "artifacts")
    return out
