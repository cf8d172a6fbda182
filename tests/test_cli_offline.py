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
    if path.name == "k80-aws.yaml":
        pytest.skip("AWS no longer offers p2 (docs/CATALOG.md); the example awaits a provider that reaches owned K80s")
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
    if path.name == "k80-aws.yaml":
        pytest.skip("AWS no longer offers p2 (docs/CATALOG.md); the example awaits a provider that reaches owned K80s")
    rel = str(path.relative_to(REPO))
    out = gpucloud("render", rel)
    assert out.returncode == 0, out.stderr
    script = tmp_path / "user-data.sh"
    script.write_text(out.stdout)
    # What is sent fits the smallest limit (AWS's 16 KB): raw, or gzip'd as fit_user_data sends it.
    from gpucloud.render import compress_user_data

    assert min(len(out.stdout.encode()), len(compress_user_data(out.stdout))) <= 16 * 1024, rel
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    check = subprocess.run([shellcheck, "-S", "style", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


def test_plan_k40_exits_2_with_alternatives(tmp_path: Path) -> None:
    spec = tmp_path / "k40.yaml"
    spec.write_text("name: k40\nresources:\n  gpu: K40:1\nrun: python3 train.py\n")
    out = gpucloud("plan", str(spec))
    assert out.returncode == 2
    assert "K40" in out.stderr and "T4" in out.stderr and "Traceback" not in out.stderr


def test_plan_k80_aws_says_p2_is_no_longer_offered() -> None:
    out = gpucloud("plan", "examples/k80-aws.yaml")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "p2.xlarge" in out.stderr and "does not offer" in out.stderr and "gpucloud stack K80" in out.stderr


def test_catalog_json_and_retired_only_with_all() -> None:
    out = gpucloud("catalog", "--gpu", "K80", "--json")
    assert json.loads(out.stdout) == []  # every K80 type is retired or withdrawn
    rows_all = json.loads(gpucloud("catalog", "--gpu", "k80", "--all", "--json").stdout)
    assert {r["status"] for r in rows_all} == {"retired"}
    assert set(rows_all[0]) == {"cloud", "region", "instance_type", "gpu", "gpu_count", "vcpus", "memory_gib", "arch",
                                "price_per_hour", "spot_price_per_hour", "status", "status_date", "source", "price_date"}
    a100 = json.loads(gpucloud("catalog", "--gpu", "A100", "--json").stdout)
    assert {r["gpu"] for r in a100} == {"A100-40GB", "A100-80GB"}
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


def test_gpus_command() -> None:
    doc = json.loads(gpucloud("gpus", "--json").stdout)
    by_name = {d["gpu"]: d for d in doc}
    assert by_name["B200"]["architecture"] == "Blackwell" and by_name["B200"]["clouds"] == ["aws"]
    assert by_name["T4"]["cheapest_on_demand"]["price_per_hour"] == 0.526
    assert by_name["K40"]["clouds"] == [] and by_name["K40"]["cheapest_spot"] is None
    out = gpucloud("gpus")
    assert out.returncode == 0 and "H100-NVL" in out.stdout
