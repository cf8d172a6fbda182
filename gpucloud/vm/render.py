"""`gpucloud render`: what a VM of a job is really given, built by the code a run uses.

A node's user-data is the shim (templates/shim.sh.j2, gpucloud/vm/shim.py); everything else it needs
is the agent's job.json (gpucloud/vm/agent_config.py) inside the agent archive the shim fetches
(docs/INTERNALS.md, "VM agent"). A render has no run and no channel, so the run id is RUN_ID and the
manifest URL is MANIFEST_URL; the archive's SHA-256 is that of the archive this job.json would be in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpucloud.contract.provider import DEFAULT_MASTER_PORT
from gpucloud.vm.agent_config import job_config
from gpucloud.vm.agent_pack import agent_archive, archive_sha256
from gpucloud.vm.shim import render_shim
from gpucloud.vm.user_data import is_shared

if TYPE_CHECKING:
    from gpucloud.contract.provider import Candidate, Capabilities
    from gpucloud.plan.planner import Plan
    from gpucloud.spec.load import JobSpec

RUN_ID = "RUN_ID"
MANIFEST_URL = "MANIFEST_URL"


@dataclass(frozen=True)
class Rendered:
    user_data: str  # the shim of the node
    job_json: str  # the agent's job.json, as the archive carries it

    def job_json_pretty(self) -> str:
        return json.dumps(json.loads(self.job_json), indent=2, sort_keys=True) + "\n"


def render_node(
    spec: JobSpec,
    plan: Plan,
    candidate: Candidate,
    *,
    caps: Capabilities,
    node_rank: int = 0,
    put_headers: tuple[str, ...] = (),
    master_port: int = DEFAULT_MASTER_PORT,
) -> Rendered:
    """One node's user-data and job config, as gpucloud/vm/user_data.py `prepare_nodes` builds them:
    the candidate's stack, image and install plan as the plan worked them out."""
    if not 0 <= node_rank < spec.num_nodes:
        raise ValueError(f"node_rank {node_rank} outside 0..{spec.num_nodes - 1}")
    shared = is_shared(spec, caps)
    cfg = job_config(
        spec,
        plan.stack_for(candidate),
        candidate,
        caps=caps,
        run_id=RUN_ID,
        node_rank=None if shared else 0,
        put_headers=put_headers,
        master_port=master_port,
        node=plan.node_for(candidate),
    )
    doc = cfg.to_json()
    shim = render_shim(
        caps=caps,
        run_id=RUN_ID,
        max_duration=int(spec.max_duration),
        agent_sha256=archive_sha256(agent_archive(doc)),
        manifest_url=MANIFEST_URL,
        node_rank=None if shared else node_rank,
    )
    return Rendered(shim, doc)
