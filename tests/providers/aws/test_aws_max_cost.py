"""`max_cost:` on the AWS simulator (docs/SPOT.md, "max_cost"): `plan` keeps only candidates that can
finish max_duration within it, and a run whose spend reaches it (here: a spot run preempted once, its
relaunch spending on top of the first attempt) is ended by the CLI following it, within a poll of
the moment, with what the job saved brought back as artifacts and the run's status saying why."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucloud.state.runs_db import Store
from tests.support.aws_sim import AwsVmSimulator, aws_sim  # noqa: F401
from tests.support.moto_server import Moto, moto, moto_server  # noqa: F401
from tests.support.polling import wait_until

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
PRICE = 0.2  # the shipped catalog's g4dn.xlarge spot price in us-east-1 ($/h)
MAX_DURATION_S = 90
MAX_COST = round(PRICE * MAX_DURATION_S / 3600 * 1.02, 6)  # one whole attempt fits; two do not


def _env(moto: Moto, home: Path) -> dict[str, str]:  # noqa: F811
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUCLOUD_TEST_", "AZURE_"))}
    env.update(moto.env)
    env.update({"GPUCLOUD_HOME": str(home), "CI": "true", "PYTHONPATH": str(REPO)})
    env["GPUCLOUD_SSH_CIDR"] = "203.0.113.7/32"
    return env


def _job(path: Path, max_cost: float) -> Path:
    script = 'mkdir -p out; echo saved > out/early.txt; trap "exit 143" TERM; while true; do sleep 0.3; done'
    path.write_text(
        "name: capped\nresources:\n  cloud: aws\n  regions: [us-east-1]\n  instance_type: g4dn.xlarge\n"
        f"  spot: true\nrecovery: {{on: [preemption], max_restarts: 1}}\nrun: {json.dumps(script)}\n"
        f"artifacts: [out/]\nmax_duration: {MAX_DURATION_S}s\nmax_cost: {max_cost}\n"
    )
    return path


def test_plan_refuses_what_max_cost_cannot_pay(moto: Moto, gpucloud_home: Path, tmp_path: Path) -> None:  # noqa: F811
    env = _env(moto, gpucloud_home)
    cheap = _job(tmp_path / "cheap.yaml", round(PRICE * MAX_DURATION_S / 3600 * 0.5, 6))
    out = subprocess.run(
        [sys.executable, "-m", "gpucloud", "plan", str(cheap)], env=env, capture_output=True, text=True, timeout=120
    )
    said = " ".join(out.stderr.split())
    assert out.returncode == 2, out.stderr
    assert "g4dn.xlarge: spot $0.200/h > $0.100/h (max_cost $0.0025 over 0.025 h x 1 node(s))" in said, said


def test_a_run_ends_when_its_spend_reaches_max_cost(
    moto: Moto,  # noqa: F811
    aws_sim: AwsVmSimulator,  # noqa: F811
    gpucloud_home: Path,
    tmp_path: Path,
) -> None:
    env = _env(moto, gpucloud_home)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.aws_cli", "run", str(_job(tmp_path / "job.yaml", MAX_COST)), "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        store = Store(gpucloud_home / "state.db")
        running = lambda: any(r.status == "running" for r in store.list_runs())  # noqa: E731
        assert wait_until(lambda: running() or proc.poll() is not None, timeout=120)
        run_id = store.list_runs()[0].id
        time.sleep(10)  # the first attempt spends a while before it is preempted
        pre = subprocess.run(
            [sys.executable, "-m", "tests.support.aws_cli", "preempt", run_id],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert pre.returncode == 0, pre.stderr
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    said = " ".join(err.split())
    assert proc.returncode == 124, said[-3000:]
    doc = json.loads(out)
    assert doc["status"] == "max-cost", doc
    assert "restart 1 of 1 after preempted" in said, said[-3000:]
    found = re.search(r"max_cost \$[0-9.]+ reached \(spent \$([0-9.]+)\)", said)
    assert found, said[-3000:]
    assert MAX_COST <= float(found.group(1)) < MAX_COST + PRICE * 10 / 3600, found.group(0)  # within a poll or two
    assert (Path(doc["artifacts_dir"]) / "out" / "early.txt").read_text() == "saved\n"
    run = Store(gpucloud_home / "state.db").get_run(run_id)
    assert run is not None and run.status == "max-cost" and "max_cost" in (run.message or "")
