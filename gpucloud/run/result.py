"""What one run reports (`gpucloud run`, `watch`, `--json`) and how a run is named."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


@dataclass
class RunResult:
    """What `gpucloud run` reports; `as_json()` is the --json document (docs/INTERNALS.md, CLI)."""

    run_id: str
    status: str
    exit_code: int | None  # None: detached, the job is still running
    artifacts_dir: str | None = None
    phases: dict[str, float] = field(default_factory=dict)
    cost: float = 0.0
    artifacts_refused: list[str] = field(default_factory=list)  # one line per member not extracted

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "status": self.status,
            "exit_code": self.exit_code,
            "artifacts_dir": self.artifacts_dir,
            "artifacts_refused": list(self.artifacts_refused),
            "phases": {k: round(v, 3) for k, v in self.phases.items()},
            "cost": round(self.cost, 6),
        }


def new_run_id(name: str, now: datetime | None = None) -> str:
    """`<name>-<YYYYMMDD-HHMMSS>-<4 hex>` (UTC): sortable, readable, unique across processes."""
    now = now or datetime.now(UTC)
    return f"{name}-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
