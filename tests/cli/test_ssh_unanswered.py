"""Machines of your own that do not answer: `hosts probe` reports every host (not only the first)
and exits 78 as the README's table says; `plan` and `render` of a `cloud: ssh` job still work from
the job file, with a warning saying what was assumed; `run` refuses (75) before any run record."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support.cli import cli
from tests.support.text import flat

JOB = """name: silent-box
resources:
  cloud: ssh
  hosts: ["127.0.0.1:1"]
  gpu: K80:1
stack:
  framework: pytorch
run: python3 -c 'import torch'
"""


def env(home: Path) -> dict[str, str]:
    return {**os.environ, "COLUMNS": "100", "GPUCLOUD_HOME": str(home), "CI": "true"}


def test_hosts_probe_reports_every_unreachable_host_and_exits_78(tmp_path: Path) -> None:
    proc = cli("hosts", "probe", "127.0.0.1:1", "127.0.0.1:2", env=env(tmp_path / "home"), timeout=120)
    assert proc.returncode == 78, proc.stdout + proc.stderr
    assert "127.0.0.1:1: unreachable" in proc.stdout and "127.0.0.1:2: unreachable" in proc.stdout
    assert "`ssh -p 2 127.0.0.1 true`" in proc.stdout and "Traceback" not in proc.stderr
    doc = json.loads(cli("hosts", "probe", "127.0.0.1:1", "127.0.0.1:2", "--json", env=env(tmp_path)).stdout)
    assert [(h["host"], h["reachable"], bool(h["problems"])) for h in doc] == [
        ("127.0.0.1:1", False, True),
        ("127.0.0.1:2", False, True),
    ]


def test_plan_and_render_without_the_host_say_what_they_assumed(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    home = tmp_path / "home"
    plan = cli("plan", "job.yaml", cwd=tmp_path, env=env(home), timeout=120)
    assert plan.returncode == 0, plan.stderr
    assert "ssh" in plan.stdout and "R470" in plan.stdout and "2.1.2" in plan.stdout  # the K80's stack
    text = flat(plan.stderr)
    assert "127.0.0.1:1 did not answer, so this plan comes from the job file alone: assumed 1 x K80" in text
    assert "ubuntu-20.04" in text and "`run` needs the host to answer" in text
    render = cli("render", "job.yaml", cwd=tmp_path, env=env(home), timeout=120)
    assert render.returncode == 0 and "gpucloud shim" in render.stdout, render.stderr
    run = cli("run", "job.yaml", "--yes", cwd=tmp_path, env=env(home), timeout=120)
    assert run.returncode == 75, run.stderr
    assert "did not answer" in flat(run.stderr) and "Traceback" not in run.stderr
    listing = cli("ls", "--json", cwd=tmp_path, env=env(home))
    assert listing.returncode == 0 and json.loads(listing.stdout or "[]") == []  # no run record
