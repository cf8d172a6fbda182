"""What the CLI prints fits an 80-column terminal and tells the truth, through the real CLI with
COLUMNS=80 and stdout piped (as in a CI log): tables fold cells instead of cutting them, dropped
columns are named on stderr, and the columns a command exists for go last; warnings wrap; retired
offerings are explained with their dates; `gc` that checked no cloud fails; `collect --json` is
plain JSON."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import clean_env, cli
from tests.support.moto_server import Moto, moto, moto_server  # noqa: F401
from tests.support.text import WIDTH, flat, header, too_wide

REPO = Path(__file__).resolve().parents[2]


# ---- plan, catalog, gpus ---------------------------------------------------------------------------------


# Every example's plan (80 columns, the market, price and estimate columns kept, instance names whole,
# dropped columns named): tests/cli/test_plan_explore.py.


def test_catalog_all_keeps_the_status_and_says_what_retired_means() -> None:
    out = cli("catalog", "--all", env=clean_env(), cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert not too_wide(out.stdout), too_wide(out.stdout)
    assert "status" in header(out.stdout, "GPU")
    text = flat(out.stdout)
    assert "retired 2023-09-06" in text and "retired 2025-12-20" in text and "retired 2025-09-30" in text
    # p2's retirement date was never announced: the date is when the API was read, and it says so.
    k80 = flat(cli("catalog", "--gpu", "K80", "--all", env=clean_env(), cwd=REPO).stdout)
    assert "not offered as of 2026-12-03" in k80 and "retired 2026-12-03" not in k80
    rows = json.loads(cli("catalog", "--all", "--json", env=clean_env(), cwd=REPO).stdout)
    for row in rows:
        assert row["instance_type"] in out.stdout.split(), row["instance_type"]


def test_gpus_never_cuts_an_instance_name() -> None:
    out = cli("gpus", env=clean_env(), cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert not too_wide(out.stdout), too_wide(out.stdout)
    words = out.stdout.split()
    for doc in json.loads(cli("gpus", "--json", env=clean_env(), cwd=REPO).stdout):
        for key in ("cheapest_on_demand", "cheapest_spot"):
            if doc[key]:
                assert doc[key]["instance_type"] in words, doc[key]["instance_type"]
    assert "…" not in out.stdout
    if "architecture" not in out.stdout:
        assert "architecture" in out.stderr and "not shown" in out.stderr


# ---- retired offerings ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "retired", "date"), [(1, "p3.2xlarge", "2025-12-20"), (4, "p3.8xlarge", "2025-12-20")]
)
def test_a_gpu_count_sold_only_on_retired_types_says_so(tmp_path: Path, count: int, retired: str, date: str) -> None:
    spec = tmp_path / "v100.yaml"
    spec.write_text(f"name: v100\nresources:\n  gpu: V100:{count}\nrun: python3 train.py\n")
    out = cli("plan", str(spec), cwd=tmp_path, env=clean_env())
    assert out.returncode == 2 and "Traceback" not in out.stderr
    text = flat(out.stderr)
    assert f"{retired} (retired {date})" in text and "Standard_NC" in text and "retired 2025-09-30" in text
    assert "p3dn.24xlarge" in text  # the V100 machine still sold, as the way forward
    assert "has 4 × V100" not in text and "has 1 × V100" not in text  # no pointing at another retired type


def test_k80_on_aws_says_not_offered_as_of_the_date_read(tmp_path: Path) -> None:
    spec = tmp_path / "k80.yaml"
    spec.write_text("name: k80\nresources:\n  cloud: aws\n  gpu: K80:1\nrun: python3 train.py\n")
    out = cli("plan", str(spec), cwd=tmp_path, env=clean_env())
    assert out.returncode == 2
    assert "p2.xlarge, p2.8xlarge, p2.16xlarge (not offered as of 2026-12-03)" in flat(out.stderr)
    assert "retired 2026-12-03" not in out.stderr


# ---- runs: ls and cost ------------------------------------------------------------------------------------

RUNS = [  # (id, cloud, region, instance type, status, exit code, detached)
    ("t4-cheapest-20261204-101700-c3d4", "azure", "southeastasia", "Standard_NC16as_T4_v3", "running", None, True),
    ("ddp-2-nodes-20261204-102000-e5f6", "aws", "ap-northeast-1", "p4de.24xlarge", "interrupted", 130, False),
    ("quickstart-20261204-102200-a1b2", "local", "local", "localhost", "succeeded", 0, False),
]


@pytest.fixture
def runs(gpucloud_home: Path) -> Iterator[Path]:
    """A state store with runs as wide as real ones: long places, a detached one, an exit code."""
    from gpucloud.state.runs_db import Store

    store = Store()
    for i, (rid, cloud, region, itype, status, code, detached) in enumerate(RUNS):
        store.create_run(
            rid,
            name=rid.rsplit("-", 3)[0],
            spec={},
            cloud=cloud,
            region=region,
            instance_type=itype,
            price_per_hour=3.2,
            detached=detached,
            status="provisioning",
        )
        store.start_attempt(
            rid, 0, cloud=cloud, region=region, instance_type=itype, spot=i == 1, price_per_hour=1.234, num_nodes=1
        )
        store.set_attempt_handle(rid, 0, "{}")
        if status == "running":
            store.update_run(rid, status="running", phase="setup", pid=os.getpid())
        else:
            store.end_attempt(rid, 0, "preempted: the cloud reclaimed the spot capacity" if code else "teardown")
            store.finish_run(
                rid,
                status,
                exit_code=code,
                message=(
                    "interrupted by Ctrl-C while the job was running; everything was torn down and the log kept"
                    if code
                    else None
                ),
            )
    store.close()
    yield gpucloud_home


def test_ls_fits_80_columns_and_names_what_it_leaves_out(runs: Path) -> None:
    out = cli("ls", env=clean_env(GPUCLOUD_HOME=str(runs)), cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert max(len(line) for line in out.stdout.splitlines()) <= WIDTH, out.stdout
    words = out.stdout.split()
    for rid, _, _, itype, *_ in RUNS:
        assert rid in words and itype in words  # the id a user copies and the machine stay whole
    for column in ("PHASE", "ELAPSED"):
        if column not in out.stdout:
            assert column in out.stderr and "not shown" in out.stderr, out.stderr


def test_status_of_one_run_wraps_its_long_lines(runs: Path) -> None:
    rid = RUNS[1][0]
    out = cli("status", rid, env=clean_env(GPUCLOUD_HOME=str(runs)), cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert max(len(line) for line in out.stdout.splitlines()) <= WIDTH, out.stdout
    assert "interrupted by Ctrl-C while the job was running" in flat(out.stdout)
    assert "p4de.24xlarge" in out.stdout


def test_cost_is_a_table_that_fits(runs: Path) -> None:
    out = cli("cost", env=clean_env(GPUCLOUD_HOME=str(runs)), cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert max(len(line) for line in out.stdout.splitlines()) <= WIDTH, out.stdout
    assert "─" in out.stdout and "$ cost" in out.stdout  # a table, not 112-column text
    words = out.stdout.split()
    for _, _, _, itype, *_ in RUNS:
        assert itype in words
    assert "total: 3 run(s)" in flat(out.stdout)


# ---- gc ------------------------------------------------------------------------------------------------------


def test_gc_that_could_check_no_cloud_exits_78_and_says_what_and_why(gpucloud_home: Path, tmp_path: Path) -> None:
    env = clean_env(GPUCLOUD_HOME=str(gpucloud_home), AZURE_CONFIG_DIR=str(tmp_path / "no-azure"))
    for args in (["gc"], ["gc", "--dry-run"], ["gc", "--cloud", "aws", "--dry-run"]):
        out = cli(*args, env=env, cwd=tmp_path)
        assert out.returncode == 78, (args, out.stderr)
        assert "Traceback" not in out.stderr and "aws:" in out.stderr, out.stderr
        assert "nothing to collect" not in out.stdout
    out = cli("gc", env=env, cwd=tmp_path)
    assert "azure:" in out.stderr and "az login" in out.stderr and "aws configure" in out.stderr
    assert "checked: local" in out.stderr
    assert cli("gc", "--cloud", "local", env=env, cwd=tmp_path).returncode == 0  # asked for this machine only


def test_gc_that_checked_some_clouds_says_which_it_left_out(
    moto: Moto,
    gpucloud_home: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = clean_env(GPUCLOUD_HOME=str(gpucloud_home), AZURE_CONFIG_DIR=str(tmp_path / "no-azure"), **moto.env)
    out = cli("gc", "--dry-run", env=env, cwd=tmp_path, timeout=300, module="tests.support.aws_cli")
    assert out.returncode == 0, out.stderr
    said = flat(out.stderr)
    assert "it did not check azure: no credentials found" in said, said
    assert "aws" in said.split("gc checked ")[1].split(";")[0], said


# ---- collect --json ---------------------------------------------------------------------------------------


def test_collect_json_is_plain_json(gpucloud_home: Path, tmp_path: Path) -> None:
    env = clean_env(GPUCLOUD_HOME=str(gpucloud_home))
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: outjob\nresources: {cloud: local}\n"
        "run: 'mkdir -p out; echo a > out/a.txt; echo b > out/b.txt'\n"
        "artifacts: [out/]\nmax_duration: 5m\n"
    )
    started = json.loads(cli("run", str(spec), "-d", "--json", env=env, cwd=tmp_path).stdout)
    end = time.monotonic() + 60
    while (
        json.loads(cli("status", started["run_id"], "--json", env=env, cwd=tmp_path).stdout)["status"]
        in ("planned", "provisioning", "running")
        and time.monotonic() < end
    ):
        time.sleep(0.3)
    got = cli("collect", started["run_id"], "--json", env=env, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert "ArtifactResult" not in got.stdout and "PosixPath" not in got.stdout
    doc = json.loads(got.stdout)
    [art] = doc["artifacts"]
    assert art == {"node": 0, "directory": doc["directory"], "files": 2, "refused": []}
    assert (Path(art["directory"]) / "out" / "a.txt").read_text() == "a\n"
