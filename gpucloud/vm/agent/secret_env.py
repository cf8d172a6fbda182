"""The job's secrets on the node: fetched sealed from the channel (sealed.py) before setup, opened
with the node's own key, kept in memory only, given to the job's steps through their environment,
and masked out of the job's output before it reaches job.log (mask.py), so neither the log
parts nor the CLI's mirror ever hold a value. docs/DATA.md, "Secrets".

Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from gpucloud.vm.agent import sealed
from gpucloud.vm.agent.stage_api import StageFailed

MASK_NAMES_VAR = "GPUCLOUD_MASKED_NAMES"  # which env names the masking filter reads its values from
AGENT_ROOT = Path(__file__).resolve().parents[3]  # the folder holding the gpucloud package


def fetch(
    url: str,
    names: Sequence[str],
    *,
    run_id: str,
    rank: int,
    get: Callable[[str], Optional[bytes]],
    key_pem: Callable[[], Optional[str]],
    passed: Callable[[], bool],
    sleep: Callable[[float], None],
    stopping: Callable[[], bool],
    log: Callable[[str], None],
) -> Dict[str, Any]:
    """The sealed document (`env`: the secrets' values; `data`: input/output grants; `registry`: the
    container image's pull login {server, username, password}), once the CLI
    has sealed it to this node's published key. Polled until the deadline (the CLI seals it when it
    sees the node's claim); StageFailed when none comes or what came is not for this node."""
    if not url:
        raise StageFailed("the manifest has no secrets_get: this CLI cannot deliver the job's secrets")
    log(f"waiting for {len(names)} secret(s) and the data grants, sealed to this node's key")
    i = 0
    while not passed():
        if stopping():
            raise StageFailed("stopped while waiting for the secrets")
        blob = get(url)
        if blob:
            return open_doc(blob, names, run_id, rank, key_pem())
        i += 1
        sleep(min(10.0, 0.2 * i))
    raise StageFailed(
        "the secrets never arrived (the CLI delivers them while it follows the run: "
        "a detached run gets them before `run --detach` returns)"
    )


def open_doc(blob: bytes, names: Sequence[str], run_id: str, rank: int, pem: Optional[str]) -> Dict[str, Any]:
    """The sealed document opened with this node's key and checked (its run, its rank, every name)."""
    if not pem:
        raise StageFailed("this node has no key to open its secrets with (openssl with Ed25519 is needed)")
    try:
        doc = json.loads(sealed.open_sealed(sealed.seed_from_pem(pem), blob).decode("utf-8"))
    except (sealed.SealError, ValueError, UnicodeDecodeError) as exc:
        raise StageFailed(f"the secrets object cannot be opened by this node: {exc}") from None
    if doc.get("run_id") != run_id or doc.get("rank") != rank:
        raise StageFailed("the secrets object was sealed for another run or node")
    values = doc.get("env") or {}
    missing = [n for n in names if n not in values]
    if missing:
        raise StageFailed(f"the secrets object lacks {', '.join(missing)}")
    registry = doc.get("registry") or {}
    return {
        "env": {str(k): str(v) for k, v in values.items()},
        "data": doc.get("data") or {},
        "registry": {str(k): str(v) for k, v in registry.items()},  # the image's pull login, if any
    }


def masked_command(command: str, names: List[str], python: str = sys.executable) -> str:
    """`command` with its output (stdout and stderr) passed through the masking filter; the step's
    exit code stays the command's (pipefail). The filter ignores SIGTERM, so a job saving its work
    on SIGTERM still has its last lines logged; it ends at the job's end of output. The wrapping
    shell traps SIGTERM (its children get the default back) so it waits for the pipeline: the step
    ends when the job does, not at the signal, and a container's job keeps its grace."""
    filt = f"PYTHONPATH={shlex.quote(str(AGENT_ROOT))} {MASK_NAMES_VAR}={shlex.quote(','.join(names))}"
    filt += f" {shlex.quote(python)} -m gpucloud.vm.agent.mask"
    return f"trap : TERM\nset -o pipefail\n{{ {command}\n}} 2>&1 | {filt}"
