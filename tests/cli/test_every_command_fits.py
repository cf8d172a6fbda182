"""Every command's human output fits an 80-column terminal (COLUMNS=80, piped as in a CI log):
no line wider than 80 but one that is a single unbreakable word (a path, a URL, an image URN).
Help is typer's own and left out; so is what is printed verbatim because it is not prose: a job's
own output (`run`, `logs`), a shell script (`render`), and JSON documents (`schema`, `iam-policy`).
`validate`'s and `import`'s YAML is checked too, except the lines of a literal block (`run: |`: the
job's own commands, as written). Their stderr (notes, warnings, errors) is checked all the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import REPO, clean_env, cli
from tests.support.text import too_wide, yaml_lines

EXAMPLES = REPO / "examples"
JOB = (
    "name: tiny\nresources: {cloud: local}\n"
    "run: 'echo a line of job output longer than eighty columns, printed as the job wrote it, never wrapped; "
    "mkdir -p out; echo x > out/x'\nartifacts: [out/]\nmax_duration: 5m\n"
)


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], Path, str]:
    """A state folder with a finished local run and its id, and a folder holding its job file."""
    home = tmp_path_factory.mktemp("home")
    work = tmp_path_factory.mktemp("work")
    (work / "tiny.yaml").write_text(JOB)
    env = clean_env(GPUCLOUD_HOME=str(home), AZURE_CONFIG_DIR=str(work / "no-azure"))
    cli("run", "tiny.yaml", env=env, cwd=work, check=True)
    rid = json.loads(cli("ls", "--json", env=env, cwd=work, check=True).stdout)[0]["run_id"]
    return env, work, rid


# (arguments, whether stdout is prose to check); RUN stands for the run id, JOB for the job file. Every
# example's plan is checked in tests/cli/test_plan_explore.py (COLUMNS=80 there too).
COMMANDS: list[tuple[list[str], bool]] = [
    (["validate", "JOB"], False),
    (["plan", str(EXAMPLES / "ngc-pytorch.yaml"), "--all"], True),
    (["render", "JOB"], False),
    (["gpus"], True),
    *[(["stack", gpu], True) for gpu in ("T4", "K80", "K40", "H100")],
    (["version"], True),
    (["run", "JOB"], False),
    (["status"], True),
    (["status", "RUN"], True),
    (["ls"], True),
    (["logs", "RUN"], False),
    (["collect", "RUN"], True),
    (["cost"], True),
    (["down", "RUN", "--yes"], True),
    (["watch", "RUN"], True),
    (["preempt", "RUN"], True),
    (["gc", "--cloud", "local"], True),
    (["gc", "--dry-run"], True),
    (["check"], True),
    (["setup", "aws"], True),
    (["catalog"], True),
    (["catalog", "--all"], True),
    (["catalog", "--gpu", "V100", "--all"], True),
    (["image", "ls"], True),
    (["hosts", "probe", "no-such-host.invalid"], True),
    (["import", str(REPO / "tests/data/peers/skypilot/distributed-pytorch-train.yaml")], False),
]


def test_validate_yaml_fits_80_columns(state: tuple[dict[str, str], Path, str]) -> None:
    """`import`'s YAML of every peer file: tests/spec/test_peer_import.py (the same text, in process)."""
    env, work, _ = state
    out = cli("validate", "tiny.yaml", env=env, cwd=work, timeout=60)
    assert not too_wide(yaml_lines(out.stdout)), too_wide(yaml_lines(out.stdout))


@pytest.mark.parametrize(("args", "prose"), COMMANDS, ids=[" ".join(a[:2]).replace("/", "_") for a, _ in COMMANDS])
def test_the_command_fits_80_columns(state: tuple[dict[str, str], Path, str], args: list[str], prose: bool) -> None:
    env, work, rid = state
    argv = [{"RUN": rid, "JOB": "tiny.yaml"}.get(a, a) for a in args]
    out = cli(*argv, env=env, cwd=work, timeout=180)
    assert "Traceback" not in out.stderr, out.stderr
    assert not too_wide(out.stderr), too_wide(out.stderr)
    if prose:
        assert not too_wide(out.stdout), too_wide(out.stdout)
