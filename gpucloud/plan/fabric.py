"""Which network a multi-node candidate's nodes talk over, as `plan` shows it: "EFA ×32" (AWS
Elastic Fabric Adapter interfaces per node), "InfiniBand", "accelerated networking" or "TCP".

Why here and not in the catalog rows: the answer is the provider's (its data and its rules, e.g. an
Azure spot VM cannot join the availability set InfiniBand needs), so each provider names a
function in its registry entry and the plan asks through the registry, never naming a provider.
A one-node candidate has no inter-node fabric: nothing is shown.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpucloud.contract.provider import Candidate


@lru_cache(maxsize=4096)
def fabric_of(cloud: str, instance_type: str, spot: bool) -> str | None:
    """The provider's fabric for this machine type; None where the provider names none."""
    from gpucloud.contract import registry as providers

    return providers.fabric(cloud, instance_type, spot)


def candidate_fabric(c: Candidate) -> str | None:
    """A multi-node candidate's fabric; None for one node or a provider that names none."""
    if c.num_nodes < 2:
        return None
    return fabric_of(c.cloud, c.instance_type, c.spot)


def fabric_json(c: Candidate) -> dict[str, str]:
    """`plan --json`'s `fabric` field of a multi-node candidate ({} otherwise)."""
    name = candidate_fabric(c)
    return {"fabric": name} if name else {}
