"""Quota before a launch: the GPU quota of each candidate's family and region, read at once before
the first create, so that a region whose quota cannot hold the request is skipped without a
launch attempt (a new account has none in most regions; learning it from a failed launch per
region costs a launch's time each, and on some clouds a partial create to clean up).

Each provider with a quota lookup (its registry entry's `quota`) answers for its own candidates
within BUDGET_S, all clouds at once. A lookup that fails or is slow is a note and the candidate is
tried as before: this gate only ever skips on a quota it read and that is below the need.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpucloud.contract import registry as providers

if TYPE_CHECKING:
    from gpucloud.contract.provider import Candidate

BUDGET_S = 4.0


@dataclass
class QuotaGate:
    """What the lookups found: plan index -> the reason to skip it; the lookups' verdicts; seconds."""

    skips: dict[int, str] = field(default_factory=dict)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


def _ask(cand: Candidate) -> dict[str, Any]:
    return {
        "region": cand.region,
        "instance_type": cand.instance_type,
        "spot": cand.spot,
        "vcpus": cand.vcpus * cand.num_nodes,
    }


def _key(v: dict[str, Any]) -> tuple[str, str, bool, float]:
    return (str(v["region"]), str(v["instance_type"]), bool(v["spot"]), float(v["need"]))


def reason(v: dict[str, Any]) -> str:
    """One line: which quota, how much there is and is needed, and the command that raises it."""
    return (
        f"quota {v['code']} ({v['name']}) is {v['limit']:g} vCPUs in {v['region']}, "
        f"{v['need']:g} needed; ask for more: {v['fix']}"
    )


def read(candidates: Sequence[Candidate], indices: list[int], budget_s: float | None = None) -> QuotaGate:
    """The gate for the candidates at `indices` (the order failover will try them in), within
    `budget_s` (BUDGET_S, read when called)."""
    budget_s = BUDGET_S if budget_s is None else budget_s
    t0 = time.monotonic()
    by_cloud: dict[str, list[dict[str, Any]]] = {}
    for i in indices:
        cand = candidates[i]
        ask = _ask(cand)
        if ask not in by_cloud.setdefault(cand.cloud, []):
            by_cloud[cand.cloud].append(ask)
    found: dict[str, list[dict[str, Any]]] = {}

    def lookup(cloud: str, asks: list[dict[str, Any]]) -> None:
        try:
            found[cloud] = list(providers.quota_verdicts(cloud, asks, budget_s) or [])
        except Exception:  # noqa: BLE001 - a lookup is advice: the launch finds out as before
            found[cloud] = []

    threads = [threading.Thread(target=lookup, args=item, daemon=True) for item in by_cloud.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, budget_s + 1.0 - (time.monotonic() - t0)))
    gate = QuotaGate(verdicts=[v for cloud in by_cloud for v in found.get(cloud, [])])
    short = {_key(v): v for v in gate.verdicts if v.get("fits") is False}
    for i in indices:
        cand = candidates[i]
        hit = short.get((cand.region, cand.instance_type, cand.spot, float(cand.vcpus * cand.num_nodes)))
        if hit is not None:
            gate.skips[i] = reason(hit)
    gate.seconds = time.monotonic() - t0
    return gate


PLAN_CANDIDATES = 40  # `plan --json` reads the quotas of this many candidates at most


def plan_quotas(candidates: Sequence[Candidate], budget_s: float = 3.0) -> list[dict[str, Any]] | None:
    """`plan --json`'s `quota`: each verdict for the first candidates of the clouds whose
    credentials look configured; None when there are none (no network call then)."""
    clouds = set(providers.configured_clouds())
    indices = [i for i, c in enumerate(candidates) if c.cloud in clouds][:PLAN_CANDIDATES]
    if not indices:
        return None
    return read(candidates, indices, budget_s).verdicts
