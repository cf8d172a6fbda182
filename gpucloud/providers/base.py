"""The Provider protocol every cloud implements, the launch request it receives, and the error
classes that drive failover (FACTS.md section 4)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from gpucloud.errors import GpucloudError

if TYPE_CHECKING:
    from gpucloud.channel import Channel
    from gpucloud.planner import Candidate
    from gpucloud.spec import JobSpec
    from gpucloud.stacks import Stack
    from gpucloud.state import Journal

TAG_RUN = "gpucloud-run"
TAG_EXPIRES = "gpucloud-expires"  # UTC, ISO 8601 "2026-12-02T17:04:05Z"


class ProvisionError(GpucloudError):
    """A cloud refused a launch. `kind` tells the lifecycle what to do next:
    capacity -> next candidate; quota -> skip the rest of that cloud+region (name `quota_code`);
    throttle -> the provider already backed off and gave up, next candidate; price -> next candidate;
    fatal -> skip every remaining candidate of that cloud."""

    kind: Literal["capacity", "quota", "throttle", "price", "fatal"] = "fatal"

    def __init__(self, message: str, *, code: str = "", quota_code: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.code = code
        self.quota_code = quota_code


class CapacityError(ProvisionError):
    kind = "capacity"


class QuotaError(ProvisionError):
    kind = "quota"


class ThrottledError(ProvisionError):
    kind = "throttle"


class PriceError(ProvisionError):
    kind = "price"


class FatalProvisionError(ProvisionError):
    kind = "fatal"


@dataclass
class LaunchRequest:
    """Everything a provider needs to create the machines of one attempt (one candidate)."""

    run_id: str
    spec: JobSpec
    candidate: Candidate
    stack: Stack
    user_data: list[str]           # rendered bootstrap, one per node rank
    expires_at: datetime           # UTC; deadline plus a teardown margin; goes into TAG_EXPIRES
    attempt: int = 0               # index in the failover order; part of idempotency tokens
    tags: dict[str, str] = field(default_factory=dict)  # TAG_RUN, TAG_EXPIRES, Name ...


@runtime_checkable
class Provider(Protocol):
    """One cloud. Every cloud call that creates something is preceded by `journal.intent(...)`
    and followed by `journal.created(...)`, so a crash at any point can be cleaned up."""

    name: str  # "local" | "aws" | "azure"

    def channel(self, region: str) -> Channel:
        """The object store the VM talks to for runs in this region (created on first use)."""
        ...

    def provision(self, req: LaunchRequest, journal: Journal) -> list[str]:
        """Create the machines; return their ids in rank order. On failure, raise a ProvisionError
        subclass after cleaning up whatever this attempt created (the lifecycle also tears down)."""
        ...

    def node_states(self, run_id: str, region: str) -> list[str]:
        """Per node, in rank order: "pending" | "running" | "stopping" | "gone". Lets the lifecycle
        tell a dead VM from a slow one together with the heartbeat in status.json."""
        ...

    def teardown(self, run_id: str, region: str, journal: Journal, *, wait: bool = True) -> None:
        """Delete everything of the run in that region. Idempotent; safe after a partial provision."""
        ...

    def gc(self, now: datetime, *, dry_run: bool) -> list[str]:
        """Find (and unless dry_run delete) every tagged resource whose TAG_EXPIRES has passed,
        in every region. Returns one human line per resource."""
        ...
