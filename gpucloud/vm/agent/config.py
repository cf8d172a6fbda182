"""The job as the agent sees it: one JSON document the CLI packs into the agent archive
(gpucloud/vm/agent_config.py builds it), so the hash the shim checks covers the commands too.

Stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Mapping


@dataclass
class JobConfig:
    """Everything the bash template got as variables; names follow the status document's."""

    run_id: str
    num_nodes: int = 1
    rank: int = 0
    shared: bool = False  # one user-data for every node: the rank comes from the launch index
    master_port: int = 29500
    barrier_s: int = 600
    max_duration: int = 3600
    deadline_why: str = ""  # said at the deadline when it is not max_duration's: the run's max_cost
    grace: int = 30  # backstop fires at boot + max_duration + grace
    setup: str = ""
    run: str = "true"
    artifacts: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)
    checkpoint: str = ""
    checkpoint_interval: int = 99999999
    notice_s: float = 5.0
    preempt_grace: int = 15
    log_s: float = 5.0
    heartbeat_s: float = 15.0
    tick_s: float = 1.0
    log_part_max: int = 16 * 1024 * 1024
    self_termination: str = "exit"  # exit | shutdown | azure-delete: picks the provider hooks
    preemption_notice: str = ""  # "" | aws-imds-spot | azure-scheduled-events
    node_ips_known: bool = False
    stack: Dict[str, Any] = field(default_factory=dict)  # gpucloud/vm/stack_config.py's document
    put_headers: List[str] = field(default_factory=list)
    secrets: List[str] = field(default_factory=list)  # names only: the values come sealed (secret_env.py)
    data: bool = False  # inputs/outputs: their grants come sealed too (data.py)
    outputs_interval: int = 0  # > 0: outputs are also uploaded this often while the job runs
    gpu_sample_s: float = 0.0  # > 0: the GPUs are sampled this often (gpu_watch.py)
    idle_timeout: int = 0  # > 0: every GPU idle this long ends the run (exit 125)
    # {} runs setup/run on the machine; else {image, options, user, entrypoint[, login{registry,
    # username, password_secret}]}: they run in that image (container.py); the password is a secret
    container: Dict[str, Any] = field(default_factory=dict)
    # The cloud's endpoints the provider hooks call (Capabilities.node_endpoints), e.g. the ARM
    # endpoint and token audience of a sovereign cloud; {}: the hooks' public-cloud defaults.
    endpoints: Dict[str, str] = field(default_factory=dict)
    # > 0: the machine is kept this long idle after a job for the next one (keep.py); keep_key is
    # the run owner's public key (base64), the one whose signed requests it runs
    keep_s: int = 0
    keep_key: str = ""
    keep_poll_s: float = 0.5

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "JobConfig":
        """Known keys only (a newer CLI may add some); a missing run_id is an error."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def load(cls, path: Path) -> "JobConfig":
        return cls.from_mapping(json.loads(Path(path).read_text(encoding="utf-8")))

    def to_json(self) -> str:
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)}, sort_keys=True, separators=(",", ":"))

    @property
    def gpu_count(self) -> int:
        return int(self.stack.get("gpu_count", 0) or 0)
