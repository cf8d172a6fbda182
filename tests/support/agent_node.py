"""Running the shim and agent on this machine against a FileChannel, as the local provider would:
the job's config, the agent archive uploaded, the manifest written, the shim rendered."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpucloud.channel.run_objects import FileChannel, pack_workdir
from gpucloud.contract.provider import Candidate
from gpucloud.contract.registry import capabilities
from gpucloud.plan.stacks import resolve_stack
from gpucloud.spec.load import JobSpec
from gpucloud.vm.agent_config import job_config
from gpucloud.vm.agent_pack import agent_archive, archive_sha256
from gpucloud.vm.shim import render_shim

RUN_ID = "run-agent-0001"


@dataclass
class LocalNode:
    channel: FileChannel
    shim: Path
    vm_dir: Path
    run_id: str = RUN_ID

    def run(self, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        full = {**os.environ, "GPUCLOUD_VM_DIR": str(self.vm_dir), "GPUCLOUD_DEADLINE_GRACE": "10", **(env or {})}
        return subprocess.run(
            ["sh", str(self.shim)], capture_output=True, text=True, env=full, timeout=timeout, check=False
        )

    def status(self) -> dict | None:
        return self.channel.read_status(self.run_id, 0)


def local_node(
    tmp: Path,
    *,
    run: str,
    setup: str | None = None,
    artifacts: list[str] | None = None,
    max_duration: int = 600,
    workdir: Path | None = None,
    env: dict[str, str] | None = None,
) -> LocalNode:
    spec = JobSpec(
        name="job",
        resources={"cloud": ["local"]},
        run=run,
        setup=setup,
        env=env or {},
        artifacts=artifacts or [],
        max_duration=max_duration,
    )
    stack = resolve_stack(None)
    cand = Candidate(
        cloud="local",
        region="local",
        instance_type="localhost",
        gpu="",
        gpu_count=0,
        num_nodes=1,
        spot=False,
        price_per_hour=0.0,
        total_per_hour=0.0,
        estimated_cost=0.0,
    )
    caps = capabilities("local")
    channel = FileChannel(tmp / "store")
    cfg = job_config(spec, stack, cand, caps=caps, run_id=RUN_ID, log_interval=0.2, heartbeat_interval=0.5)
    archive = agent_archive(cfg.to_json())
    channel.upload_agent(RUN_ID, archive)
    src = workdir or tmp / "src"
    src.mkdir(exist_ok=True)
    tarball = pack_workdir(src, dest=tmp / "code.tar.gz")
    channel.upload_code(RUN_ID, tarball)
    deadline = datetime.now(UTC) + timedelta(seconds=max_duration)
    url = channel.prepare(RUN_ID, 1, deadline, agent=True)[0]
    shim = tmp / "shim.sh"
    shim.write_text(
        render_shim(
            caps=caps, run_id=RUN_ID, max_duration=max_duration, agent_sha256=archive_sha256(archive), manifest_url=url
        )
    )
    return LocalNode(channel, shim, tmp / "vm")
