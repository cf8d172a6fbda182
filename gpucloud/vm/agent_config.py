"""The agent's job config (CLI side): the JSON document gpucloud/vm/agent/config.py reads on the
node (job.json in the agent archive), built from the job, its resolved stack, the chosen candidate
and the provider's Capabilities (timings, stack config, spot settings: gpucloud/vm/job_env.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpucloud.channel.run_objects import LOG_PART_MAX
from gpucloud.contract.provider import DEFAULT_MASTER_PORT, Capabilities
from gpucloud.spec.data import any_mounted
from gpucloud.vm.agent.config import JobConfig
from gpucloud.vm.job_env import check_env, container_config, gpu_sampling, timings
from gpucloud.vm.stack_config import stack_config

if TYPE_CHECKING:
    from gpucloud.contract.provider import Candidate
    from gpucloud.plan.images import NodeStack
    from gpucloud.plan.stacks import Stack
    from gpucloud.spec.load import JobSpec


def deadline_grace(max_duration: int) -> int:
    """Seconds the backstop waits past max_duration: a tenth of it, 30..300 s."""
    return max(30, min(300, max_duration // 10))


def job_config(
    spec: JobSpec,
    stack: Stack,
    candidate: Candidate,
    *,
    caps: Capabilities,
    run_id: str,
    node_rank: int | None = 0,
    put_headers: Sequence[str] = (),
    log_interval: float | None = None,
    heartbeat_interval: float | None = None,
    master_port: int = DEFAULT_MASTER_PORT,
    barrier_timeout: float | None = None,
    node: NodeStack | None = None,
) -> JobConfig:
    """One node's (or, with node_rank=None, every node's) agent config. `node`: the machine's image
    and install plan as the plan worked it out (Plan.node_for); without it, worked out here."""
    if node_rank is not None and not 0 <= node_rank < spec.num_nodes:
        raise ValueError(f"node_rank {node_rank} outside 0..{spec.num_nodes - 1}")
    log_s, hb_s, barrier_s = timings(caps, log_interval, heartbeat_interval, barrier_timeout, master_port)
    env = check_env(spec.env)  # refuses names the node keeps for itself
    if node is None:
        from gpucloud.plan.images import candidate_node

        node = candidate_node(stack, candidate, spec.image)
    sample_s, idle_timeout = gpu_sampling(spec, candidate.gpu_count if candidate.gpu else 0)
    return JobConfig(
        run_id=run_id,
        num_nodes=int(spec.num_nodes),
        rank=0 if node_rank is None else int(node_rank),
        shared=node_rank is None,
        master_port=int(master_port),
        barrier_s=max(1, math.ceil(barrier_s)),
        max_duration=int(spec.max_duration),
        grace=deadline_grace(int(spec.max_duration)),
        setup=spec.setup or "",
        run=spec.run,
        artifacts=list(spec.artifacts),
        env=env,
        checkpoint=spec.checkpoint or "",
        checkpoint_interval=int(spec.checkpoint_interval) if spec.checkpoint else 99999999,
        notice_s=min(5.0, hb_s / 2),
        preempt_grace=max(1, math.ceil(caps.preemption_grace)),
        log_s=log_s,
        heartbeat_s=hb_s,
        tick_s=max(0.05, min(log_s, hb_s, 1.0)),
        log_part_max=LOG_PART_MAX,
        self_termination=caps.self_termination,
        preemption_notice=caps.preemption_notice or "",
        node_ips_known=caps.node_ips_known,
        stack=stack_config(node, stack, candidate, caps, mounts=any_mounted(spec.inputs)),
        put_headers=list(put_headers),
        secrets=list(spec.secrets),
        data=bool(spec.inputs or spec.outputs),
        outputs_interval=int(spec.checkpoint_interval) if spec.outputs and spec.outputs_sync == "interval" else 0,
        gpu_sample_s=sample_s,
        idle_timeout=idle_timeout,
        container=container_config(spec, node, owned_host=not caps.install_stack),
        endpoints=dict(caps.node_endpoints),
    )
