"""Render the VM shim (templates/shim.sh.j2): the small POSIX-sh user-data that arms the deadline
backstop, fetches the agent archive through the channel, checks its SHA-256 and starts the agent
(docs/INTERNALS.md, "VM agent"). Everything else a node needs travels in the archive's job.json.
"""

from __future__ import annotations

import re
from functools import cache

import jinja2

from gpucloud.contract.provider import Capabilities
from gpucloud.vm.agent_config import deadline_grace
from gpucloud.vm.env import load_template_source
from gpucloud.vm.job_env import quote

SHIM_TEMPLATE = "shim.sh.j2"
SHIM_TARGET_BYTES = 4096
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_SHA = re.compile(r"^[0-9a-f]{64}$")


@cache
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(load_template_source),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        comment_start_string="{##",
        comment_end_string="##}",
    )
    env.filters["q"] = quote
    return env


def render_shim(
    *,
    caps: Capabilities,
    run_id: str,
    max_duration: int,
    agent_sha256: str,
    manifest_url: str,
    node_rank: int | None = 0,
) -> str:
    """The user-data of one node (node_rank=None: one for every node, the rank from the launch index)."""
    if not _RUN_ID.match(run_id):
        raise ValueError(f"run id {run_id!r} must match {_RUN_ID.pattern}")
    if not _SHA.match(agent_sha256):
        raise ValueError("agent_sha256 must be 64 lower-case hex digits")
    return (
        _env()
        .get_template(SHIM_TEMPLATE)
        .render(
            run_id=run_id,
            node_rank=0 if node_rank is None else int(node_rank),
            shared=node_rank is None,
            max_duration=int(max_duration),
            grace=deadline_grace(int(max_duration)),
            agent_sha256=agent_sha256,
            manifest_url=manifest_url,
            default_dir=caps.vm_dir,
            self_termination=caps.self_termination,
        )
    )
