"""What the creation steps (network.py, nodes.py, roles.py) need from AzureProvider, without
importing it: its ARM clients, and the journal entry around each create call."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gpucloud.contract.provider import Journal


class Arm(Protocol):
    """The provider as the creation steps see it (AzureProvider satisfies it)."""

    name: str

    @property
    def subscription_id(self) -> str: ...

    @property
    def resource(self) -> Any: ...

    @property
    def network(self) -> Any: ...

    @property
    def compute(self) -> Any: ...


def tracked(
    arm: Arm, journal: Journal, run_id: str, region: str, kind: str, name: str, create: Callable[[], Any]
) -> Any:
    """Journal the intent, make the call, journal the result (INTERNALS: Providers)."""
    res_id = journal.intent(run_id, kind, name, region, arm.name)
    result = create()
    journal.created(res_id, str(result))
    return result
