"""The container image's size, read from its registry at plan time (gpucloud/plan/oci_client.py), rides
in job.json to the node, whose pull deadline scales with it (size / 5 MB/s, at least 600 s, never
past the run's deadline: gpucloud/vm/agent/container.py `pull_limit`). Against Debian's real
docker-registry (tests/support/containers.py); the slow pull is a stub engine that never finishes,
with the rule's rate and floor scaled down so that the test takes seconds."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from gpucloud.contract.registry import capabilities
from gpucloud.plan.oci_client import MANIFESTS, pull_size
from gpucloud.plan.planner import make_plan
from gpucloud.spec.load import parse_spec
from gpucloud.vm.agent import container
from gpucloud.vm.agent.config import JobConfig
from gpucloud.vm.agent.stage_api import StageEnv
from gpucloud.vm.agent_config import job_config
from tests.support.containers import ContainerLab


def test_pull_size_is_the_manifests_layers_and_config() -> None:
    doc = {"config": {"size": 1500}, "layers": [{"size": 10_000}, {"size": 2_500}]}
    assert pull_size(doc) == 14_000
    assert pull_size({"config": {"size": 1}, "layers": [{"size": "9"}]}) == 0  # not a count: unknown
    assert pull_size({"config": {"size": 1}, "layers": [{"digest": "x"}]}) == 0  # a size left out: unknown
    assert pull_size({"layers": [{"size": True}]}) == 0


def _manifest_size(image: str) -> int:
    host, _, rest = image.partition("/")
    repo, _, tag = rest.rpartition(":")
    req = urllib.request.Request(
        f"http://{host}/v2/{repo}/manifests/{tag}",
        headers={"Accept": ", ".join(MANIFESTS)},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 (the test's own registry)
        doc = json.loads(resp.read())
    return int(doc["config"]["size"]) + sum(int(layer["size"]) for layer in doc["layers"])


def _job_json(image: str) -> JobConfig:
    spec = parse_spec(
        f"name: sized\nresources: {{cloud: aws, gpu: 'T4:1', regions: [us-east-1]}}\nrun: x\ncontainer: {image}\n",
        "job.yaml",
    )
    plan = make_plan(spec)
    cand = plan.candidates[0]
    cfg = job_config(spec, plan.stack_for(cand), cand, caps=capabilities("aws"), run_id="r1", node=plan.node_for(cand))
    return JobConfig.from_mapping(json.loads(cfg.to_json()))  # as the node reads it


def test_the_registrys_size_reaches_job_json_and_bounds_a_slow_pull(
    container_lab: ContainerLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _job_json(container_lab.image)
    size = _manifest_size(container_lab.image)
    assert size > 0 and cfg.container["size_bytes"] == size, cfg.container
    # The rule at a test's scale: the image "downloads" at 1/2 of its size per second, floor 0.5 s.
    monkeypatch.setattr(container, "PULL_MIN_BPS", size / 2)
    monkeypatch.setattr(container, "PULL_MIN_S", 0.5)
    monkeypatch.setattr(container, "PULL_TRIES", 1)
    docker = tmp_path / "docker"
    docker.write_text('#!/bin/sh\ncase "$1" in pull) exec /bin/sleep 60;; esac\nexit 1\n')  # a pull that never ends
    docker.chmod(0o755)
    logged: list[str] = []
    env = StageEnv(
        log=logged.append,
        vm_dir=tmp_path,
        environ={"PATH": str(tmp_path)},
        now=time.monotonic,
        sleep=lambda s: None,
        stopping=lambda: False,
    )
    box = container.Container(cfg.container, tmp_path, tmp_path, "r1", 0)
    box.engine = str(docker)
    t0 = time.monotonic()
    with pytest.raises(container.ImageUnavailable):
        box.pull(env, None, lambda: 3600.0)  # an hour left of the run: the size, not the deadline, bounds it
    took = time.monotonic() - t0
    assert 1.5 <= took < 10, (took, logged)  # 2 s for this size, not the hour the run has left
    assert any("did not finish within 2 s" in line for line in logged), logged
