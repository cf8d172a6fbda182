"""A team's shared state store on a real PostgreSQL server: runs owned by who launched them
(`ls` / `ls --all`, `cost` / `cost --all-users`), a GPUCLOUD_STATE that cannot be used as one
paragraph and a documented exit code, and no driver loaded where no store is opened."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucloud.state.runs_db import Store
from tests.support.cli import REPO, cli

# The CLI in this process, then whether a PostgreSQL driver was loaded (whatever the exit code).
PROBE = """
import sys
sys.argv = ["gpucloud", *sys.argv[1:]]
from gpucloud.cli.entry import main
try:
    main()
except SystemExit:
    pass
sys.stderr.write("DRIVER:" + str(any(m.split(".")[0] in ("psycopg", "psycopg_binary") for m in sys.modules)))
"""


def _loads_driver(command: str) -> bool:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *command.split()], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert "DRIVER:" in proc.stderr, proc.stderr
    return proc.stderr.rsplit("DRIVER:", 1)[1].startswith("True")


def _runs_of(users: dict[str, list[str]]) -> None:
    """Runs recorded as each user's CLI would record them."""
    for user, run_ids in users.items():
        os.environ["GPUCLOUD_USER"] = user
        try:
            store = Store()
            for run_id in run_ids:
                store.create_run(run_id, name=run_id.split("-")[0], detached=True)
                store.finish_run(run_id, "succeeded", exit_code=0)
            store.close()
        finally:
            del os.environ["GPUCLOUD_USER"]


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_each_run_is_owned_by_who_launched_it(backend: str) -> None:
    _runs_of({"ana": ["train-a1", "train-a2"], "bo": ["eval-b1"]})
    env = {**os.environ, "GPUCLOUD_USER": "ana"}
    mine = json.loads(cli("ls", "--json", env=env, check=True).stdout)
    assert sorted(r["run_id"] for r in mine) == ["train-a1", "train-a2"]
    assert {r["owner"] for r in mine} == {"ana"}
    every = json.loads(cli("ls", "--all", "--json", env=env, check=True).stdout)
    assert sorted((r["run_id"], r["owner"]) for r in every) == [
        ("eval-b1", "bo"),
        ("train-a1", "ana"),
        ("train-a2", "ana"),
    ]
    own_cost = json.loads(cli("cost", "--json", env=env, check=True).stdout)
    assert own_cost["total"]["runs"] == 2
    team_cost = json.loads(cli("cost", "--all-users", "--json", env=env, check=True).stdout)
    assert team_cost["total"]["runs"] == 3 and {r["owner"] for r in team_cost["runs"]} == {"ana", "bo"}
    # Another user sees the same store: bo's `status` of ana's run works (the store is shared).
    detail = json.loads(cli("status", "train-a1", "--json", env={**env, "GPUCLOUD_USER": "bo"}, check=True).stdout)
    assert detail["owner"] == "ana"


def test_the_sqlite_store_lists_every_run(gpucloud_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One person's file: `ls` is not filtered, whatever GPUCLOUD_USER says."""
    monkeypatch.delenv("GPUCLOUD_STATE", raising=False)
    _runs_of({"ana": ["a-1"], "bo": ["b-1"]})
    runs = json.loads(cli("ls", "--json", env={**os.environ, "GPUCLOUD_USER": "ana"}, check=True).stdout)
    assert sorted(r["run_id"] for r in runs) == ["a-1", "b-1"]


@pytest.mark.parametrize(
    ("url", "code", "words"),
    [
        ("mysql://u@h/db", 78, "is not a state store gpucloud knows"),
        ("postgresql://u:hunter2@[broken/db", 78, "not a PostgreSQL URL the driver can read"),
        ("postgresql://u:hunter2@127.0.0.1:9/db", 74, "cannot be used: connection failed"),
    ],
)
def test_an_unusable_state_url_is_one_paragraph(url: str, code: int, words: str) -> None:
    proc = cli("ls", env={**os.environ, "GPUCLOUD_STATE": url})
    assert proc.returncode == code, proc.stderr
    assert words in " ".join(proc.stderr.split()) and "Traceback" not in proc.stderr
    assert "hunter2" not in proc.stderr  # a password in the URL is never shown


def test_a_missing_driver_says_which_extra_to_install(tmp_path: Path) -> None:
    """psycopg made unimportable (as where the extra is not installed): exit 78 and the pip command."""
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text("import sys\nsys.modules['psycopg'] = None\n")
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    env = {**os.environ, "GPUCLOUD_STATE": "postgresql://u@127.0.0.1:9/db", "PYTHONPATH": path}
    proc = cli("ls", env=env)
    assert proc.returncode == 78, proc.stderr
    assert "pip install 'gpucloud[postgres]'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", ["--help", "plan examples/t4-any-cloud.yaml", "ls"])
def test_no_driver_is_imported_without_a_shared_store(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUCLOUD_STATE", raising=False)
    assert not _loads_driver(command)


@pytest.mark.parametrize("command", ["--help", "plan examples/t4-any-cloud.yaml"])
def test_help_and_plan_open_no_store_even_when_one_is_set(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCLOUD_STATE", "postgresql://u@127.0.0.1:9/db")
    assert not _loads_driver(command)
    assert _loads_driver("ls")  # the probe sees a driver where one is loaded
