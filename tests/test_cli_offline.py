"""The offline commands through the real CLI (subprocess): validate, plan, render, catalog, stack,
schema, version; JSON shapes; clear errors with exit 2; no cloud SDK on the start-up path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def gpucloud(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpucloud", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "CI": "true"}, timeout=60)


def test_version_and_help() -> None:
    out = gpucloud("version")
    assert out.returncode == 0 and out.stdout.startswith("gpucloud ")
    out = gpucloud("--help")
    assert out.returncode == 0
    for command in ("validate", "plan", "render", "catalog", "stack", "run", "status", "logs", "down", "gc", "schema"):
        assert command in out.stdout


@pytest.mark.parametrize("argv", [["--help"], ["version"], ["validate", "examples/t4-any-cloud.yaml"]])
def test_no_cloud_sdk_imported(argv: list[str]) -> None:
    code = (
        "import sys\n"
        "from gpucloud.cli import app\n"
        "try:\n    app(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'boto3', 'botocore', 'azure'})\n"
        "print('SDK:' + ','.join(bad), file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert "SDK:" in out.stderr
    assert out.stderr.strip().splitlines()[-1] == "SDK:", out.stderr


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_validates_and_plans(path: Path) -> None:
    rel = str(path.relative_to(REPO))
    assert gpucloud("validate", rel).returncode == 0
    out = gpucloud("plan", "--json", rel)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["candidates"], rel
    prices = [c["total_per_hour"] for c in doc["candidates"]]
    assert prices == sorted(prices)
    human = gpucloud("plan", rel)
    assert human.returncode == 0 and "Candidates" in human.stdout


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_renders_shellcheck_clean(path: Path, tmp_path: Path) -> None:
    rel = str(path.relative_to(REPO))
    out = gpucloud("render", rel)
    assert out.returncode == 0, out.stderr
    script = tmp_path / "user-data.sh"
    script.write_text(out.stdout)
    assert len(out.stdout.encode()) <= 16 * 1024, f"{rel}: {len(out.stdout.encode())} bytes"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    check = subprocess.run([shellcheck, "-S", "style", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


def test_plan_k40_exits_2_with_alternatives(tmp_path: Path) -> None:
    spec = tmp_path / "k40.yaml"
    spec.write_text("name: k40\nresources:\n  gpu: K40:1\nrun: python3 train.py\n")
    out = gpucloud("plan", str(spec))
    assert out.returncode == 2
    assert "K40" in out.stderr and "K80" in out.stderr and "Traceback" not in out.stderr


def test_plan_k80_aws_shows_legacy_warning() -> None:
    out = gpucloud("plan", "examples/k80-aws.yaml")
    assert out.returncode == 0
    assert "p2.xlarge" in out.stdout and "legacy" in out.stderr


def test_catalog_json_and_retired_only_with_all() -> None:
    out = gpucloud("catalog", "--gpu", "K80", "--json")
    rows = json.loads(out.stdout)
    assert rows and {r["status"] for r in rows} == {"legacy"}
    assert set(rows[0]) == {"cloud", "region", "instance_type", "gpu", "gpu_count", "vcpus", "memory_gib",
                            "price_per_hour", "spot_price_per_hour", "status"}
    rows_all = json.loads(gpucloud("catalog", "--gpu", "k80", "--all", "--json").stdout)
    assert {"legacy", "retired"} <= {r["status"] for r in rows_all}
    bad = gpucloud("catalog", "--gpu", "K8O")
    assert bad.returncode == 2 and "K80" in bad.stderr


def test_stack_command() -> None:
    out = gpucloud("stack", "K80")
    assert out.returncode == 0
    assert "470" in out.stdout and "11.4" in out.stdout
    doc = json.loads(gpucloud("stack", "T4", "--json").stdout)
    assert {"gpu", "architecture", "driver", "cuda", "cudnn", "os_image", "framework", "reasons"} <= set(doc)
    bad = gpucloud("stack", "K80", "--cuda", "12.2")
    assert bad.returncode == 2 and "11" in bad.stderr and "Traceback" not in bad.stderr


def test_schema_is_json_schema() -> None:
    doc = json.loads(gpucloud("schema").stdout)
    assert doc.get("type") == "object" and "resources" in doc["properties"]


def test_bad_cloud_flag_is_exit_2() -> None:
    out = gpucloud("plan", "examples/t4-any-cloud.yaml", "--cloud", "gcp")
    assert out.returncode == 2 and "aws, azure, local" in out.stderr
