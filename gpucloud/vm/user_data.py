"""An attempt's user-data: the agent archive (job config inside) uploaded to the channel, the
manifests written with its URL, and one shim per node (or one for all, shared) that checks the
archive's SHA-256 before it starts the agent (docs/INTERNALS.md, "VM agent").
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from gpucloud.vm.agent_config import job_config
from gpucloud.vm.agent_pack import agent_archive, archive_sha256
from gpucloud.vm.shim import render_shim

if TYPE_CHECKING:
    from gpucloud.channel.run_objects import Channel
    from gpucloud.contract.provider import Candidate, Capabilities
    from gpucloud.plan.images import NodeStack
    from gpucloud.plan.stacks import Stack
    from gpucloud.spec.load import JobSpec


def is_shared(spec: JobSpec, caps: Capabilities) -> bool:
    """One user-data for every node: a multi-node run on a provider that launches N identical machines."""
    return spec.num_nodes > 1 and caps.shared_user_data


def prepare_nodes(
    spec: JobSpec,
    stack: Stack,
    cand: Candidate,
    *,
    node: NodeStack,
    caps: Capabilities,
    channel: Channel,
    run_id: str,
    deadline: datetime,
    master_port: int,
    deadline_why: str = "",
) -> list[str]:
    """Upload the agent, write the manifests, and return each node's user-data (rank order); `node`
    is the machines' image and install plan, as the plan worked it out (Plan.node_for);
    `deadline_why`: what set the deadline when not max_duration (the node says it at the deadline)."""
    shared = is_shared(spec, caps)
    cfg = job_config(
        spec,
        stack,
        cand,
        caps=caps,
        run_id=run_id,
        node_rank=None if shared else 0,
        put_headers=channel.put_headers,
        master_port=master_port,
        node=node,
    )
    cfg.deadline_why = deadline_why
    if spec.keep:  # a kept machine runs the jobs this run's owner key signs (vm/agent/keep.py)
        from gpucloud.channel.owner import owner_public

        cfg.keep_s, cfg.keep_key = int(spec.keep), owner_public(run_id)
    archive = agent_archive(cfg.to_json())
    channel.upload_agent(run_id, archive)
    urls = channel.prepare(
        run_id,
        spec.num_nodes,
        deadline,
        checkpoint=bool(spec.checkpoint),
        agent=True,
        secrets=bool(spec.secrets or spec.inputs or spec.outputs),
        keep=bool(spec.keep),
    )
    if shared:
        # N identical machines in one call: each finds its rank at boot, its manifest in the index.
        urls = [channel.node_index(run_id, urls, deadline, agent=True)]
    sha = archive_sha256(archive)
    user_data = [
        render_shim(
            caps=caps,
            run_id=run_id,
            max_duration=int(spec.max_duration),
            agent_sha256=sha,
            manifest_url=url,
            node_rank=None if shared else rank,
        )
        for rank, url in enumerate(urls)
    ]
    return user_data * spec.num_nodes if shared else user_data
