"""Failing right on real accounts, as a new user meets it: every case through the real CLI
in a subprocess, with the exit code and message it must give. No cloud is reached: a dead endpoint
(127.0.0.1:9) and missing credentials are what a real account looks like when it is set up wrong.
The cloud-backed cases (failover across clouds) are in test_fail_right_clouds.py."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucloud.state.runs_db import Store
from tests.support.cli import cli, start_cli
from tests.support.polling import wait_until
from tests.support.text import flat

REPO = Path(__file__).resolve().parents[2]
DEAD = "http://127.0.0.1:9"


def no_cloud_env(home: Path, **extra: str) -> dict[str, str]:
    """An environment with no cloud credentials at all (the new user's machine)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_", "GPUCLOUD_", "IDENTITY_"))}
    env.update(
        {
            "GPUCLOUD_HOME": str(home),
            "CI": "true",
            "PYTHONPATH": str(REPO),
            "AWS_SHARED_CREDENTIALS_FILE": str(home / "no-credentials"),
            "AWS_CONFIG_FILE": str(home / "no-config"),
            "AWS_EC2_METADATA_DISABLED": "true",
            "AZURE_CONFIG_DIR": str(home / "no-azure"),
        }
    )
    env.update(extra)
    return env


def dead_aws(home: Path) -> dict[str, str]:
    return no_cloud_env(
        home,
        AWS_ACCESS_KEY_ID="AKIAFAKE",
        AWS_SECRET_ACCESS_KEY="fake",
        AWS_ENDPOINT_URL=DEAD,
        AWS_DEFAULT_REGION="us-east-1",
    )


def job(folder: Path, text: str, name: str = "job.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


T4_ANY = "name: anyjob\nresources:\n  gpu: T4:1\nrun: echo hi\nmax_duration: 10m\n"
LOCAL = "name: localjob\nresources: {{cloud: local}}\nrun: {run}\nartifacts: [out/]\nmax_duration: 5m\n"


def error_doc(out: subprocess.CompletedProcess[str]) -> dict:
    doc = json.loads(out.stdout)
    assert set(doc["error"]) == {"exit_code", "kind", "message", "hint", "details"}, doc
    assert doc["error"]["exit_code"] == out.returncode
    return doc["error"]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


# ---- credentials and endpoints ------------------------------------------------------------------------


def test_dead_endpoint_fails_fast_naming_it_costs_nothing_and_cleans_nothing(tmp_path: Path, home: Path) -> None:
    spec = job(tmp_path, T4_ANY.replace("T4:1", "T4:1\n  cloud: aws"))
    out = cli("run", str(spec), "--yes", cwd=tmp_path, env=dead_aws(home), timeout=90)
    assert out.returncode == 78, out.stderr
    assert "127.0.0.1:9" in flat(out.stderr) and "AWS_ENDPOINT_URL" in flat(out.stderr)
    for wrong in ("internal error", "throttle", "quota", "could not delete", "teardown", "cleanup"):
        assert wrong not in flat(out.stderr).lower(), (wrong, out.stderr)
    assert flat(out.stderr).count("could not reach") == 1, out.stderr  # found once, before any launch
    runs = json.loads(cli("ls", "--json", cwd=tmp_path, env=dead_aws(home), timeout=90).stdout)
    assert runs == []  # the credentials check before the prompt: no run was started, nothing billed


def test_cloud_any_without_any_credentials_exits_78_with_each_clouds_reason(tmp_path: Path, home: Path) -> None:
    spec = job(tmp_path, T4_ANY)
    out = cli("run", str(spec), "--yes", "--json", cwd=tmp_path, env=no_cloud_env(home), timeout=90)
    err = error_doc(out)
    assert out.returncode == 78 and err["kind"] == "configuration"
    reasons = [d["cloud_reason"] for d in err["details"]]
    assert any(r.startswith("AWS") for r in reasons) and any(r.startswith("Azure") for r in reasons), reasons
    for reason in reasons:  # each cloud's reason once, with the fix, before anything is launched
        assert flat(out.stderr).count(flat(reason)) == 1, out.stderr
    assert "provision" not in flat(out.stderr) and "attempt" not in flat(out.stderr), out.stderr
    assert "DefaultAzureCredential failed" not in flat(out.stderr) and "aka.ms" not in flat(out.stderr)
    assert "internal error" not in flat(out.stderr)


def test_check_reports_each_cloud_with_the_fix(tmp_path: Path, home: Path) -> None:
    out = cli("check", "--json", cwd=tmp_path, timeout=60, env=dead_aws(home))
    assert out.returncode == 78, out.stderr
    doc = json.loads(out.stdout)
    by_cloud = {c["cloud"]: c for c in doc["clouds"]}
    assert set(by_cloud) == {"aws", "azure"} and doc["usable"] == []
    assert "127.0.0.1:9" in by_cloud["aws"]["problems"][0]["problem"]
    assert all(p["fix"] for c in doc["clouds"] for p in c["problems"])
    assert all(c["seconds"] < 10 for c in doc["clouds"])
    human = cli("check", "--cloud", "aws", cwd=tmp_path, env=no_cloud_env(home), timeout=90)
    assert human.returncode == 78 and "no AWS credentials found" in human.stdout and "fix" in human.stdout
    assert cli("check", "--cloud", "local", cwd=tmp_path, env=no_cloud_env(home), timeout=90).returncode == 2


# ---- --json always answers; pipes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["schema"],
        ["plan", "--json", "examples/t4-any-cloud.yaml"],
        ["catalog", "--all", "--json"],
        ["catalog", "--all"],
        ["ls"],
    ],
)
def test_closed_stdout_ends_quietly(args: list[str], home: Path) -> None:
    env = no_cloud_env(home)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpucloud", *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # `| true`: nobody reads
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) in (0, 141), stderr
    assert "internal error" not in stderr and "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


# ---- terminal habits --------------------------------------------------------------------------------------


def test_help_short_option_and_completion(home: Path) -> None:
    out = cli("-h", cwd=REPO, env=no_cloud_env(home), timeout=90)
    assert out.returncode == 0 and "--install-completion" in out.stdout
    assert cli("run", "-h", cwd=REPO, env=no_cloud_env(home), timeout=90).returncode == 0


def test_tables_fit_80_columns_without_cutting_instance_names(home: Path) -> None:
    out = cli("catalog", "--gpu", "A100-80GB", cwd=REPO, env=no_cloud_env(home), timeout=90)
    assert out.returncode == 0
    assert max(len(line) for line in out.stdout.splitlines()) <= 80
    assert "Standard_NC24ads_A100_v4" in out.stdout and "…" not in out.stdout
    plan = cli("plan", "examples/t4-any-cloud.yaml", cwd=REPO, env=no_cloud_env(home), timeout=90)
    assert max(len(line) for line in plan.stdout.splitlines()) <= 80
    assert "Standard_NC4as_T4_v3" in plan.stdout and "…" not in plan.stdout
    wide = cli("catalog", "--gpu", "A100-80GB", cwd=REPO, env=no_cloud_env(home, COLUMNS="160"), timeout=90)
    assert "vCPU" in wide.stdout and max(len(line) for line in wide.stdout.splitlines()) > 80


def test_missing_workdir_fails_validate_and_plan_and_upload_is_described(tmp_path: Path, home: Path) -> None:
    spec = job(tmp_path, "name: wd\nresources: {gpu: T4:1}\nrun: echo\nworkdir: nope\n")
    for command in ("validate", "plan"):
        out = cli(command, str(spec), cwd=tmp_path, env=no_cloud_env(home), timeout=90)
        assert out.returncode == 2 and "workdir" in flat(out.stderr) and "does not exist" in flat(out.stderr), (
            out.stderr
        )
    (tmp_path / "nope").mkdir()
    (tmp_path / "nope" / "train.py").write_text("print('hi')\n")
    out = cli("validate", str(spec), cwd=tmp_path, env=no_cloud_env(home), timeout=90)
    assert (
        out.returncode == 0
        and f"workdir {(tmp_path / 'nope').resolve()}: 1 file(s)" in flat(out.stderr)
        and "max_duration 6h00m (21600 s)" in flat(out.stderr)
    ), out.stderr
    doc = json.loads(cli("plan", str(spec), "--json", cwd=tmp_path, env=no_cloud_env(home), timeout=90).stdout)
    assert doc["upload"]["files"] == 1 and doc["upload"]["max_duration_s"] == 21600


def _on_tty(
    args: list[str], env: dict[str, str], cwd: Path, answer: bytes | None, timeout: float = 60
) -> tuple[int, str]:
    """Run the CLI with a terminal on stdin (so it may prompt); answer the prompt if one comes."""
    master, slave = pty.openpty()
    env = {k: v for k, v in env.items() if k != "CI"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpucloud", *args],
        cwd=cwd,
        env=env,
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(slave)
    if answer is not None:
        os.write(master, answer)
    try:
        _, stderr = proc.communicate(timeout=timeout)
    finally:
        os.close(master)
    return proc.returncode, stderr


def test_no_prompt_for_a_free_run_nor_for_credentials_that_fail(tmp_path: Path, home: Path) -> None:
    spec = job(tmp_path, LOCAL.format(run="echo done"))
    code, stderr = _on_tty(["run", str(spec)], no_cloud_env(home), tmp_path, answer=None)
    assert code == 0 and "Launch it?" not in stderr, stderr
    priced = job(tmp_path, T4_ANY, "priced.yaml")  # declining: tests/run/test_launch_credentials.py (moto, fake ARM)
    code, stderr = _on_tty(["run", str(priced)], dead_aws(home), tmp_path, answer=b"n\n")
    assert code == 78 and "Launch it?" not in stderr, stderr  # credentials that do not work: no prompt at all


# ---- detached and orphaned runs ---------------------------------------------------------------------------


def _wait_final(env: dict[str, str], run_id: str, cwd: Path, timeout: float = 30) -> dict:
    end = time.monotonic() + timeout
    while True:
        doc = json.loads(cli("status", run_id, "--json", cwd=cwd, env=env, timeout=90).stdout)
        if doc["status"] not in ("running", "provisioning") or time.monotonic() > end:
            return doc
        time.sleep(0.3)


def test_detached_run_json_then_collect_brings_results_back(tmp_path: Path, home: Path) -> None:
    env = no_cloud_env(home)
    spec = job(tmp_path, LOCAL.format(run="'mkdir -p out; echo result > out/r.txt; echo logline; exit 3'"))
    out = cli("run", str(spec), "-d", "--json", cwd=tmp_path, env=env, timeout=90)
    doc = json.loads(out.stdout)
    assert out.returncode == 0 and doc["status"] == "detached" and doc["exit_code"] is None
    assert f"`gpucloud collect {doc['run_id']}`" in " ".join(out.stderr.split())  # how its results come back
    final = _wait_final(env, doc["run_id"], tmp_path)
    assert final["status"] == "failed" and final["exit_code"] == 3
    human = cli("status", doc["run_id"], cwd=tmp_path, env=env, timeout=90)
    assert "not yet deleted" not in human.stdout, human.stdout  # the local process has exited
    got = cli("collect", doc["run_id"], cwd=tmp_path, env=env, timeout=90)
    assert got.returncode == 3, got.stderr
    assert "(exit 3)" in got.stderr and "None" not in got.stderr
    dest = tmp_path / "gpucloud-runs" / doc["run_id"]
    assert (dest / "out" / "r.txt").read_text() == "result\n" and b"logline" in (dest / "job.log").read_bytes()
    assert json.loads(cli("status", doc["run_id"], "--json", cwd=tmp_path, env=env, timeout=90).stdout)[
        "artifacts_dir"
    ] == str(dest)


def test_killed_cli_is_not_succeeded_until_collected(tmp_path: Path, home: Path) -> None:
    env = no_cloud_env(home)
    go = tmp_path / "go"  # the job ends once the CLI is killed, not after a fixed sleep (bounded at 60 s)
    wait = f"for i in $(seq 600); do [ -f {go} ] && break; sleep 0.1; done"
    spec = job(tmp_path, LOCAL.format(run=f"'{wait}; mkdir -p out; echo ok > out/r.txt'"))
    proc = start_cli("run", str(spec), cwd=tmp_path, env=env)

    def running() -> str:  # read from the store: a CLI start per poll cost more than the run itself
        return next((r.id for r in Store(home / "state.db").list_runs() if r.status == "running"), "")

    if not wait_until(lambda: running() or proc.poll() is not None, timeout=90) or not running():
        proc.kill()
        _, err = proc.communicate(timeout=10)
        runs = json.loads(cli("ls", "--json", cwd=tmp_path, env=env, timeout=90).stdout)
        raise AssertionError(f"the run never showed as running: ls {runs}; run's stderr:\n{err[-3000:]}")
    run_id = running()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    go.touch()
    end = time.monotonic() + 90
    doc: dict = {}
    while time.monotonic() < end and doc.get("status") != "collecting":  # the job ends on its own
        time.sleep(0.5)
        doc = json.loads(cli("status", run_id, "--json", cwd=tmp_path, env=env, timeout=90).stdout)
    assert doc["status"] == "collecting" and f"gpucloud collect {run_id}" in doc["message"], doc
    got = cli("collect", run_id, "--json", cwd=tmp_path, env=env, timeout=90)
    result = json.loads(got.stdout)
    assert got.returncode == 0 and result["status"] == "succeeded", got.stderr
    assert (Path(result["directory"]) / "out" / "r.txt").read_text() == "ok\n"


# ---- every command that takes --json, discovered from the app --------------------------------------------


def json_commands() -> set[str]:
    """Every command and subcommand of the typer app with a `--json` option ("catalog refresh")."""
    import typer

    from gpucloud.cli.app import app

    found: set[str] = set()

    def walk(command: object, path: list[str]) -> None:
        if any("--json" in getattr(p, "opts", []) for p in getattr(command, "params", [])):
            found.add(" ".join(path))
        for name, sub in (getattr(command, "commands", None) or {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


# No success path that is both cheap and offline: listing images and refreshing the catalog need a
# cloud API (moto / the fake ARM server, covered in their own tests); probing a host needs sshd.
NO_OFFLINE_SUCCESS = {"image ls", "image build", "catalog refresh", "hosts probe"}
OK, ERROR, REPORT = "ok", "error", "report"  # REPORT: a non-zero exit that is the command's answer


def json_walk_cases(tmp_path: Path, run_id: str, live_id: str) -> list[tuple[list[str], int, str]]:
    """(arguments, exit code, what stdout must be) for each command with --json: success paths
    where they are cheap and offline, and failure paths (bad argument, unknown run, missing file,
    dead endpoint)."""
    bad = job(tmp_path, "name: Bad_Name\nresources:\n  gpu: ZZZ:1\nrun: 1\n", "bad.yaml")
    good = job(tmp_path, T4_ANY, "good.yaml")
    k40 = job(tmp_path, "name: k40\nresources: {gpu: K40:1}\nrun: echo\n", "k40.yaml")
    return [
        (["watch", live_id], 0, OK),  # first: the run must still be going when `watch` starts
        (["validate", str(good)], 0, OK),
        (["validate", str(bad)], 2, ERROR),
        (["validate", "missing.yaml"], 2, ERROR),
        (["plan", str(good)], 0, OK),
        (["plan", str(bad)], 2, ERROR),
        (["plan", "--bogus", "x"], 2, ERROR),
        (["plan", str(k40)], 2, ERROR),  # a GPU no cloud offers: the nearest alternatives in the error
        (["catalog"], 0, OK),
        (["catalog", "--gpu", "nope"], 2, ERROR),
        (["catalog", "--cloud", "nope"], 2, ERROR),
        (["catalog", "refresh"], 75, ERROR),
        (["catalog", "refresh", "--cloud", "local"], 2, ERROR),
        (["gpus"], 0, OK),
        (["gpus", "--bogus"], 2, ERROR),
        (["stack", "T4"], 0, OK),
        (["stack", "nope"], 2, ERROR),
        (["run", "missing.yaml"], 2, ERROR),
        (["run", str(bad)], 2, ERROR),
        (["run", str(good), "--cloud", "nope"], 2, ERROR),
        (["run", str(good), "--yes"], 78, ERROR),
        (["status"], 0, OK),
        (["status", run_id], 0, OK),
        (["status", "nosuchrun"], 2, ERROR),
        (["ls"], 0, OK),
        (["ls", "extra"], 2, ERROR),
        (["collect", run_id], 0, OK),
        (["collect", "nosuchrun"], 2, ERROR),
        (["collect"], 2, ERROR),
        (["watch", run_id], 2, ERROR),
        (["watch", "nosuchrun"], 2, ERROR),
        (["cost"], 0, OK),
        (["cost", run_id], 0, OK),
        (["cost", "nosuchrun"], 2, ERROR),
        (["cost", "--since", "notadate"], 2, ERROR),
        (["check"], 78, REPORT),
        (["check", "--cloud", "local"], 2, ERROR),
        (["check", "--cloud", "azure"], 78, REPORT),
        (["image", "ls", "--cloud", "aws", "--region", "us-east-1"], 78, ERROR),
        (["image", "ls", "--cloud", "local", "--region", "x"], 2, ERROR),
        (["image", "ls"], 2, ERROR),
        (["image", "build", str(good), "--cloud", "aws", "--yes"], 78, ERROR),
        (["image", "build", "ZZZ", "--yes"], 2, ERROR),
        (["image", "build", str(good), "--cloud", "local"], 2, ERROR),
        (["hosts", "probe", "bad!host"], 2, ERROR),
        (["hosts", "probe", "127.0.0.1:9"], 78, REPORT),  # each host's verdict, the silent one named
        (["setup", "aws", "--print"], 0, OK),
        (["setup", "aws", "--yes"], 78, ERROR),
        (["setup", "nope"], 2, ERROR),
        (["hosts", "probe"], 2, ERROR),
        (["budget", "ls"], 0, OK),
        (["budget", "ls", "extra"], 2, ERROR),
    ]


def command_of(args: list[str], known: set[str]) -> str:
    """The (sub)command a case runs: "catalog refresh" before "catalog"."""
    two = " ".join(args[:2])
    return two if two in known else args[0]


def test_json_parses_on_every_exit_path_of_every_command(tmp_path: Path, home: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    known = json_commands()
    assert {
        "validate",
        "plan",
        "catalog",
        "catalog refresh",
        "gpus",
        "run",
        "status",
        "collect",
        "check",
        "cost",
        "hosts probe",
        "image ls",
    } <= known, known
    env = dead_aws(home)  # every cloud call meets a dead endpoint (127.0.0.1:9) and fails fast
    env["AZURE_CONFIG_DIR"] = str(home / "no-azure")
    spec = job(tmp_path, LOCAL.format(run="'mkdir -p out; echo ok > out/r.txt'"), "local.yaml")
    first = cli("run", str(spec), "--yes", "--json", cwd=tmp_path, env=env, timeout=90)
    assert first.returncode == 0, first.stderr
    run_id = json.loads(first.stdout)["run_id"]
    live = job(tmp_path, LOCAL.format(run="'sleep 6'"), "live.yaml")  # still running when `watch` starts
    detached = cli("run", str(live), "-d", "--yes", "--json", cwd=tmp_path, env=env, timeout=90)
    assert detached.returncode == 0, detached.stderr
    cases = json_walk_cases(tmp_path, run_id, json.loads(detached.stdout)["run_id"])
    walked = {command_of(args, known) for args, _, _ in cases} | {"run"}
    assert walked == known, f"commands with --json but no case here: {known - walked}"
    for command in known:
        kinds = {kind for args, _, kind in cases if command_of(args, known) == command}
        assert ERROR in kinds, f"{command}: no failure path walked"
        assert command in NO_OFFLINE_SUCCESS or command == "run" or OK in kinds or REPORT in kinds, command

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda case: cli(*case[0], "--json", cwd=tmp_path, timeout=60, env=env), cases))
    for (args, code, kind), out in zip(cases, results, strict=True):
        where = (args, out.returncode, out.stdout[-400:], out.stderr[-400:])
        doc = json.loads(out.stdout)  # exactly one JSON document on stdout, whatever happened
        assert out.returncode == code, where
        assert "Traceback" not in flat(out.stderr) and "internal error" not in flat(out.stderr), where
        if kind == ERROR:
            assert set(doc) == {"error"}, where
            error_doc(out)
        else:
            assert not (isinstance(doc, dict) and "error" in doc), where
    docs = {tuple(args): json.loads(out.stdout) for (args, _, _), out in zip(cases, results, strict=True)}
    bad = str(tmp_path / "bad.yaml")
    details = docs[("validate", bad)]["error"]["details"]  # each problem of the file, with its line and field
    assert [(d["line"], d["field"]) for d in details] == [(1, "name"), (3, "resources.gpu.model"), (4, "run")]
    assert all(d["file"] == bad and d["message"] for d in details)
