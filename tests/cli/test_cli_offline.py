"""The offline commands through the real CLI (subprocess): validate, plan, render, catalog, stack,
schema, version; JSON shapes; clear errors with exit 2; no cloud SDK on the start-up path."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpucloud.cli.app import app
from tests.support.cli import ci_env, cli
from tests.support.sshd import example_hosts_lab, have_sshd

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


@pytest.fixture(scope="module")
def example_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The examples' placeholder SSH hosts (examples/k80-ssh.yaml), served by stub machines."""
    if not have_sshd():  # only the examples that name hosts need them (they skip then)
        yield {}
        return
    lab = example_hosts_lab(tmp_path_factory.mktemp("example-hosts") / "lab")
    yield lab.env()
    lab.close()


def test_version_and_help() -> None:
    out = cli("version", env=ci_env(), cwd=REPO, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("gpucloud ")
    out = cli("--help", env=ci_env(), cwd=REPO, timeout=60)
    assert out.returncode == 0
    for command in ("validate", "plan", "render", "catalog", "stack", "run", "status", "logs", "down", "gc", "schema"):
        assert command in out.stdout


@pytest.mark.parametrize("argv", [["--help"], ["version"], ["validate", "examples/t4-any-cloud.yaml"]])
def test_no_cloud_sdk_imported(argv: list[str]) -> None:
    code = (
        "import sys\n"
        "from gpucloud.cli.app import app\n"
        "try:\n    app(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'boto3', 'botocore', 'azure'})\n"
        "print('SDK:' + ','.join(bad), file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert "SDK:" in out.stderr
    assert out.stderr.strip().splitlines()[-1] == "SDK:", out.stderr


def needs_hosts(path: Path, example_hosts: dict[str, str]) -> None:
    if "hosts:" in path.read_text() and not example_hosts:
        pytest.skip("needs /usr/sbin/sshd and ssh (openssh-server; .ci/run installs it)")


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_validates(path: Path) -> None:
    """Planned (human and --json, the candidates in price order) in tests/cli/test_plan_explore.py."""
    rel = str(path.relative_to(REPO))
    assert cli("validate", rel, env=ci_env(), cwd=REPO, timeout=60).returncode == 0


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_renders_shellcheck_clean(
    path: Path, example_hosts: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs_hosts(path, example_hosts)
    rel = str(path.relative_to(REPO))
    out = cli("render", rel, env=ci_env(**example_hosts), cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    script = tmp_path / "user-data.sh"
    script.write_text(out.stdout)
    # What is sent must fit every provider's user-data limit: the raw script, or gzip'd by fit_user_data
    # (cloud-init unpacks it) when the raw one is over.
    from gpucloud.contract.provider import fit_user_data, user_data_size
    from gpucloud.contract.registry import capabilities, names

    for cloud in names():
        caps = capabilities(cloud)
        sent = fit_user_data(out.stdout, caps)
        assert caps.user_data_limit is None or user_data_size(sent, caps) <= caps.user_data_limit, (rel, cloud)
    assert out.stdout.startswith("#!/bin/sh\n") and "# gpucloud shim: run RUN_ID" in out.stdout
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    check = subprocess.run([shellcheck, "-S", "style", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    # the job.json the shim's agent gets: the example's own run command, for the same node (the same
    # command in this process: a second CLI start per example only to read a JSON document)
    monkeypatch.chdir(REPO)
    for name, value in {"CI": "true", **example_hosts}.items():
        monkeypatch.setenv(name, value)
    cfg = CliRunner().invoke(app, ["render", rel, "--agent-config"])
    assert cfg.exit_code == 0, cfg.stderr
    doc = json.loads(cfg.stdout)
    assert doc["run_id"] == "RUN_ID" and doc["run"].strip(), doc
    assert doc["run"] == yaml.safe_load(path.read_text()).get("run", doc["run"])
    if path.name == "k80-ssh.yaml":  # the host's driver used as it is; the node ends by exiting
        assert "shutdown" not in out.stdout
        assert doc["stack"]["skip_stack"] is True and doc["stack"]["gpu_check"] == "warn"
        assert doc["self_termination"] == "exit"


def test_plan_k40_exits_2_with_alternatives(tmp_path: Path) -> None:
    spec = tmp_path / "k40.yaml"
    spec.write_text("name: k40\nresources:\n  gpu: K40:1\nrun: python3 train.py\n")
    out = cli("plan", str(spec), env=ci_env(), cwd=REPO, timeout=60)
    assert out.returncode == 2
    assert "K40" in out.stderr and "T4" in out.stderr and "Traceback" not in out.stderr


def test_plan_k80_aws_says_p2_is_no_longer_offered(tmp_path: Path) -> None:
    spec = tmp_path / "k80-aws.yaml"
    spec.write_text(
        "name: k80\nresources:\n  cloud: aws\n  gpu: K80:1\nstack:\n  framework: pytorch\nrun: python3 train.py\n"
    )
    out = cli("plan", str(spec), env=ci_env(), cwd=REPO, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "p2.xlarge" in out.stderr and "does not offer" in out.stderr and "gpucloud stack K80" in out.stderr


def test_catalog_json_and_retired_only_with_all() -> None:
    out = cli("catalog", "--gpu", "K80", "--json", env=ci_env(), cwd=REPO, timeout=60)
    assert json.loads(out.stdout) == []  # every K80 type is retired or withdrawn
    rows_all = json.loads(cli("catalog", "--gpu", "k80", "--all", "--json", env=ci_env(), cwd=REPO, timeout=60).stdout)
    assert {r["status"] for r in rows_all} == {"retired"}
    assert set(rows_all[0]) == {
        "cloud",
        "region",
        "instance_type",
        "gpu",
        "gpu_count",
        "vcpus",
        "memory_gib",
        "arch",
        "price_per_hour",
        "spot_price_per_hour",
        "status",
        "status_date",
        "status_basis",
        "source",
        "price_date",
        "price_source",
    }
    a100 = json.loads(cli("catalog", "--gpu", "A100", "--json", env=ci_env(), cwd=REPO, timeout=60).stdout)
    assert {r["gpu"] for r in a100} == {"A100-40GB", "A100-80GB"}
    bad = cli("catalog", "--gpu", "K8O", env=ci_env(), cwd=REPO, timeout=60)
    assert bad.returncode == 2 and "K80" in bad.stderr


def test_stack_command() -> None:
    out = cli("stack", "K80", env=ci_env(), cwd=REPO, timeout=60)
    assert out.returncode == 0
    assert "470" in out.stdout and "11.4" in out.stdout
    doc = json.loads(cli("stack", "T4", "--json", env=ci_env(), cwd=REPO, timeout=60).stdout)
    assert {"gpu", "architecture", "driver", "cuda", "cudnn", "os_image", "framework", "reasons"} <= set(doc)
    bad = cli("stack", "K80", "--cuda", "12.2", env=ci_env(), cwd=REPO, timeout=60)
    assert bad.returncode == 2 and "11" in bad.stderr and "Traceback" not in bad.stderr


def test_schema_is_json_schema() -> None:
    doc = json.loads(cli("schema", env=ci_env(), cwd=REPO, timeout=60).stdout)
    assert doc.get("type") == "object" and "resources" in doc["properties"]


def test_bad_cloud_flag_is_exit_2() -> None:
    out = cli("plan", "examples/t4-any-cloud.yaml", "--cloud", "gcp", env=ci_env(), cwd=REPO, timeout=60)
    assert out.returncode == 2 and "aws, azure, local" in out.stderr


def test_gpus_command() -> None:
    doc = json.loads(cli("gpus", "--json", env=ci_env(), cwd=REPO, timeout=60).stdout)
    by_name = {d["gpu"]: d for d in doc}
    assert by_name["B200"]["architecture"] == "Blackwell" and by_name["B200"]["clouds"] == ["aws"]
    assert by_name["T4"]["cheapest_on_demand"]["price_per_hour"] == 0.526
    assert by_name["K40"]["clouds"] == [] and by_name["K40"]["cheapest_spot"] is None
    out = cli("gpus", env=ci_env(), cwd=REPO, timeout=60)
    assert out.returncode == 0 and "H100-NVL" in out.stdout


@pytest.mark.parametrize(("bad", "line", "column"), [("\x1b", 2, 10), ("\x07", 1, 9), ("\ufffe", 2, 10)])
def test_a_character_yaml_rejects_is_a_spec_error_with_line_and_column(
    tmp_path: Path, bad: str, line: int, column: int
) -> None:
    """A stray control character (an escape sequence pasted from a terminal) is a spec error, exit 2,
    naming file, line, column and the fix; never an internal error."""
    job = tmp_path / "job.yaml"
    text = f'name: "a{bad}b"\nrun: echo hi\n' if line == 1 else f"name: x\nrun: echo{bad} hi\n"
    job.write_text(text, encoding="utf-8")
    for command in (["validate", str(job)], ["run", str(job), "--cloud", "local", "--yes"]):
        out = cli(*command, env=ci_env(**{"GPUCLOUD_HOME": str(tmp_path / "home")}), cwd=REPO, timeout=60)
        assert out.returncode == 2, out.stderr
        assert f"{job}:{line}:" in out.stderr and f"column {column}" in out.stderr, out.stderr
        assert f"U+{ord(bad):04X}" in out.stderr and "Delete it" in out.stderr
        assert "internal error" not in out.stderr and "Traceback" not in out.stderr
