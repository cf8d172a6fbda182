"""Launch requests for the AWS provider's tests, made the way the lifecycle makes them (a job file
through the planner): one node, or N nodes sharing one script."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta

from gpucloud.contract.provider import TAG_EXPIRES, TAG_RUN, LaunchRequest
from gpucloud.plan.requests import launch_request

REGION = "us-east-1"
SCRIPT = '#!/bin/bash\n# one script for every node\necho "node $GPUCLOUD_NODE_RANK"\n'
SPEC = """
name: unit-{name}
resources:
  cloud: aws
  gpu: {gpu}
  spot: {spot}
  disk_gb: 120
  ssh: {ssh}
image: {image}
run: echo hello
max_duration: 1h
"""


_counter = iter(range(10_000))


def make_request(
    *,
    gpu: str = "T4:1",
    spot: bool = False,
    ssh: bool = False,
    image: str = "auto",
    region: str = "us-east-1",
    script: str = "#!/bin/bash\necho hi\n",
    attempt: int = 0,
    expires_in: timedelta = timedelta(hours=2),
) -> LaunchRequest:
    """One node's launch request, as the lifecycle makes it for a job of `gpu` on AWS."""
    from gpucloud.plan.planner import make_plan
    from gpucloud.spec.load import parse_spec

    n = next(_counter)
    spec = parse_spec(
        SPEC.format(name=n, gpu=gpu, spot=str(spot).lower(), ssh=str(ssh).lower(), image=image), "unit.yaml"
    )
    plan = make_plan(spec, cloud="aws", region=region)
    cand = next(c for c in plan.candidates if c.spot == spot)
    run_id = f"unit-{n}-{random.randrange(16**6):06x}"
    expires = datetime.now(UTC).replace(microsecond=0) + expires_in
    return launch_request(
        spec,
        plan.stack,
        cand,
        run_id=run_id,
        user_data=[script],
        expires_at=expires,
        attempt=attempt,
        tags={TAG_RUN: run_id, TAG_EXPIRES: expires.strftime("%Y-%m-%dT%H:%M:%SZ")},
    )


def multinode_request(
    nodes: int, *, region: str = REGION, expires_in: timedelta = timedelta(hours=2), ssh: bool = False
) -> LaunchRequest:
    """What the lifecycle hands a shared_user_data provider: N copies of one script."""
    from gpucloud.plan.planner import make_plan
    from gpucloud.spec.load import parse_spec

    n = next(_counter)
    spec = parse_spec(
        f"name: mn-{n}\nresources:\n  cloud: aws\n  gpu: T4:1\n  ssh: {str(ssh).lower()}\n"
        f"num_nodes: {nodes}\nrun: echo hi\nmax_duration: 1h\n",
        "mn.yaml",
    )
    plan = make_plan(spec, cloud="aws", region=region)
    cand = next(c for c in plan.candidates if not c.spot)
    run_id = f"mn-{n}-{int(time.time() * 1000) % 16**6:06x}"
    expires = datetime.now(UTC).replace(microsecond=0) + expires_in
    return launch_request(
        spec,
        plan.stack,
        cand,
        run_id=run_id,
        user_data=[SCRIPT] * nodes,
        expires_at=expires,
        tags={TAG_RUN: run_id, TAG_EXPIRES: expires.strftime("%Y-%m-%dT%H:%M:%SZ"), "Name": f"gpucloud-{run_id}"},
    )
