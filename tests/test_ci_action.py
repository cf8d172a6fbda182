"""The GitHub Action (action.yml) run the way the runner runs a composite action: each `run:` step
written to a script and started as `bash --noprofile --norc -eo pipefail SCRIPT` in
$GITHUB_WORKSPACE, with `${{ ... }}` expressions substituted and the files GitHub provides
(GITHUB_OUTPUT per step, GITHUB_STEP_SUMMARY, GITHUB_ENV, RUNNER_TEMP), against the local provider.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.source_tree import SOURCE, built_dist

REPO = Path(__file__).resolve().parent.parent
ACTION = REPO / "action.yml"
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")

pytestmark = pytest.mark.slow


def load_action() -> dict[str, Any]:
    return yaml.safe_load(ACTION.read_text())


def substitute(text: str, context: dict[str, dict[str, Any]]) -> str:
    """The expression forms action.yml uses: inputs.X, github.X, steps.ID.outputs.X.
    Anything else fails the test, so a new form gets an emulation before it is relied on."""

    def one(match: re.Match[str]) -> str:
        parts = match.group(1).split(".")
        if len(parts) == 2 and parts[0] in ("inputs", "github"):
            return str(context[parts[0]][parts[1]])
        if len(parts) == 4 and parts[0] == "steps" and parts[2] == "outputs":
            return str(context["steps"].get(parts[1], {}).get(parts[3], ""))  # unset outputs are ''
        raise AssertionError(f"expression the emulator does not know: {match.group(0)}")

    return EXPRESSION.sub(one, text)


def parse_output_file(text: str) -> dict[str, str]:
    """GITHUB_OUTPUT: `name=value` lines and `name<<DELIMITER` ... `DELIMITER` blocks."""
    out: dict[str, str] = {}
    lines = iter(text.splitlines())
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            body = []
            for more in lines:
                if more == delim:
                    break
                body.append(more)
            out[name] = "\n".join(body)
        elif "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
    return out


@dataclass
class ActionRun:
    outputs: dict[str, str]
    log: str  # every step's stdout + stderr, as the job log shows it
    failed_step: str | None  # name of the step that failed (the runner stops there)
    exit_status: int  # that step's exit status (0 when all passed)
    summary: str
    step_outputs: dict[str, dict[str, str]] = field(default_factory=dict)


def run_action(
    inputs: dict[str, str],
    workspace: Path,
    tmp: Path,
    *,
    action_path: Path = REPO,
    env_extra: dict[str, str] | None = None,
) -> ActionRun:
    action = load_action()
    assert action["runs"]["using"] == "composite"
    given = dict(inputs)
    resolved: dict[str, str] = {}
    for name, spec in action["inputs"].items():
        if name in given:
            resolved[name] = given.pop(name)
        elif spec.get("required"):
            raise AssertionError(f"required input {name} not given")
        else:
            resolved[name] = str(spec.get("default", ""))
    assert not given, f"inputs the action does not declare: {sorted(given)}"
    runner_temp = tmp / "runner-temp"
    runner_temp.mkdir(exist_ok=True)
    summary = tmp / "step-summary.md"
    github_env = tmp / "github-env"
    for f in (summary, github_env):
        f.touch()
    context: dict[str, dict[str, Any]] = {
        "inputs": resolved,
        "github": {"action_path": str(action_path), "workspace": str(workspace)},
        "steps": {},
    }
    import os

    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "RUNNER_", "GITLAB_"))}
    base_env.update(
        {
            "CI": "true",
            "GITHUB_ACTIONS": "true",
            "GITHUB_WORKSPACE": str(workspace),
            "GITHUB_ACTION_PATH": str(action_path),
            "GITHUB_ENV": str(github_env),
            "GITHUB_STEP_SUMMARY": str(summary),
            "RUNNER_TEMP": str(runner_temp),
            "RUNNER_OS": "Linux",
            **(env_extra or {}),
        }
    )
    log: list[str] = []
    for index, step in enumerate(action["runs"]["steps"]):
        assert "run" in step and step.get("shell") == "bash", step
        assert "if" not in step, "the emulator does not evaluate step conditions"
        output_file = tmp / f"output-{index}"
        output_file.touch()
        env = dict(base_env)
        env.update({k: substitute(str(v), context) for k, v in (step.get("env") or {}).items()})
        env["GITHUB_OUTPUT"] = str(output_file)
        script = tmp / f"step-{index}.sh"
        script.write_text(substitute(step["run"], context))
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            cwd=workspace,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        log.append(f"## {step.get('name')}\n{proc.stdout}{proc.stderr}")
        if step.get("id"):
            context["steps"][step["id"]] = parse_output_file(output_file.read_text())
        if proc.returncode != 0:
            return ActionRun(
                _outputs(action, context),
                "\n".join(log),
                step.get("name"),
                proc.returncode,
                summary.read_text(),
                context["steps"],
            )
    return ActionRun(_outputs(action, context), "\n".join(log), None, 0, summary.read_text(), context["steps"])


def _outputs(action: dict[str, Any], context: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {name: substitute(spec["value"], context) for name, spec in action["outputs"].items()}


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A repository checkout with the quickstart job in it, as actions/checkout leaves it."""
    ws = tmp_path / "workspace"
    (ws / "jobs").mkdir(parents=True)
    shutil.copy(REPO / "examples" / "quickstart.yaml", ws / "jobs" / "quickstart.yaml")
    shutil.copytree(REPO / "examples" / "quickstart", ws / "jobs" / "quickstart")
    return ws


def local_inputs(spec: str, **more: str) -> dict[str, str]:
    """gpucloud is importable here already: install "false" with this interpreter (see action.yml)."""
    return {"spec": spec, "cloud": "local", "install": "false", "python": sys.executable, **more}


def test_quickstart_through_the_action(workspace: Path, tmp_path: Path) -> None:
    run = run_action(local_inputs("jobs/quickstart.yaml"), workspace, tmp_path)
    assert run.failed_step is None, run.log
    out = run.outputs
    assert re.fullmatch(r"quickstart-\d{8}-\d{6}-[0-9a-f]{4}", out["run-id"]), out
    assert out["exit-code"] == "0" and out["status"] == "succeeded"
    assert float(out["cost"]) == 0.0
    artifacts = Path(out["artifacts-dir"])
    assert artifacts.is_dir() and artifacts.parent == workspace / "gpucloud-runs"
    metrics = artifacts / "metrics.json"
    assert metrics.is_file() and "accuracy" in metrics.read_text()
    # phases are collapsible groups, opened and closed in pairs
    assert "::group::provision" in run.log and "::group::run" in run.log
    assert run.log.count("::group::") == run.log.count("::endgroup::") >= 3
    # the step summary: where, stage times, cost, exit code, artifacts
    summary = run.summary
    assert f"gpucloud run `{out['run-id']}`: succeeded" in summary
    assert "| where | local/local/localhost x 1 node(s) |" in summary
    assert "| exit code | 0 |" in summary and "| cost | $0.0000 |" in summary
    assert "| provision |" in summary and "| teardown |" in summary
    assert str(artifacts) in summary and "`metrics.json`" in summary


def test_bad_job_file_fails_the_step_with_annotations(workspace: Path, tmp_path: Path) -> None:
    (workspace / "jobs" / "bad.yaml").write_text(
        "name: Bad_Name\nresources:\n  cloud: local\n  spot: maybe\nrun: echo hi\nmax_duration: 5x\n"
    )
    run = run_action(local_inputs("jobs/bad.yaml"), workspace, tmp_path)
    assert run.failed_step == "Run the job" and run.exit_status == 2
    annotations = [line for line in run.log.splitlines() if line.startswith("::error ")]
    assert [
        re.match(r"::error file=jobs/bad\.yaml,line=(\d+),title=gpucloud%3A ([\w.]+)::", a).groups()
        for a in annotations
    ] == [("1", "name"), ("4", "resources.spot"), ("6", "max_duration")], run.log
    assert run.outputs["exit-code"] == "2" and run.outputs["run-id"] == ""
    assert "| `jobs/bad.yaml` | 4 | `resources.spot` |" in run.summary


def test_step_exit_status_follows_the_jobs_exit_code(workspace: Path, tmp_path: Path) -> None:
    (workspace / "jobs" / "fails.yaml").write_text(
        "name: fails\nresources:\n  cloud: local\nworkdir: quickstart\nrun: echo about to fail; exit 3\n"
        "max_duration: 2m\n"
    )
    run = run_action(local_inputs("jobs/fails.yaml"), workspace, tmp_path)
    assert run.failed_step == "Run the job" and run.exit_status == 3, run.log
    assert run.outputs["exit-code"] == "3" and run.outputs["status"] == "failed"
    assert run.outputs["run-id"].startswith("fails-")
    assert "about to fail" in run.log
    assert "❌ gpucloud run" in run.summary and "| exit code | 3 |" in run.summary


def test_bad_spot_input_is_refused_before_anything_runs(workspace: Path, tmp_path: Path) -> None:
    run = run_action(local_inputs("jobs/quickstart.yaml", spot="maybe"), workspace, tmp_path)
    assert run.failed_step == "Run the job" and run.exit_status == 2
    assert "::error title=gpucloud action::input spot must be true, false or empty" in run.log
    assert not (workspace / "gpucloud-runs").exists()


def test_args_reach_the_cli(workspace: Path, tmp_path: Path) -> None:
    run = run_action(local_inputs("jobs/quickstart.yaml", args="--no-wait --bogus-flag"), workspace, tmp_path)
    assert run.failed_step == "Run the job" and run.exit_status == 2
    assert "--bogus-flag" in run.log


def test_install_step_installs_the_actions_own_checkout(tmp_path: Path) -> None:
    """version empty: pip installs the action's checkout into a venv under RUNNER_TEMP (here
    without dependencies, so that no package is fetched) and later steps get that interpreter."""
    action_copy = tmp_path / "action"
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=SOURCE,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, files.decode().split("\0")):
        if (SOURCE / name).is_file():
            (action_copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(SOURCE / name, action_copy / name)
    ws = tmp_path / "ws"
    ws.mkdir()
    import os

    env = {"PYTHONPATH": ""} if os.environ.get("PYTHONPATH") else {}
    # the run step then fails (no dependencies in that venv): only the install step is checked
    run = run_action(
        {"spec": "missing.yaml", "python": sys.executable, "pip-args": "--no-deps"},
        ws,
        tmp_path,
        action_path=action_copy,
        env_extra=env,
    )
    venv_python = tmp_path / "runner-temp" / "gpucloud-venv" / "bin" / "python"
    assert run.step_outputs["install"] == {"python": str(venv_python)}, run.log
    assert "gpucloud 0.1.0 on Python 3." in run.log
    where = subprocess.run(
        [str(venv_python), "-c", "import gpucloud; print(gpucloud.__file__)"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=tmp_path,
        check=True,
    ).stdout
    assert where.startswith(str(tmp_path / "runner-temp" / "gpucloud-venv")), where
    assert run.failed_step == "Run the job"


def test_install_step_installs_the_wheel_by_version(tmp_path: Path) -> None:
    """version given: pip installs `gpucloud==VERSION` as a user's runner does, here from a folder
    holding the wheel CI tests (--no-index --find-links) instead of PyPI; the venv then has every
    subpackage and data file the CLI needs, from that wheel, not an editable link."""
    import os

    dist = built_dist(tmp_path / "dist")
    wheel = next(dist.glob("gpucloud-*.whl"))
    version = wheel.name.split("-")[1]
    ws = tmp_path / "ws"
    ws.mkdir()
    env = {"PYTHONPATH": ""} if os.environ.get("PYTHONPATH") else {}
    run = run_action(
        {
            "spec": "missing.yaml",
            "python": sys.executable,
            "version": version,
            "pip-args": f"--no-deps --no-index --find-links {dist}",
        },
        ws,
        tmp_path,
        env_extra=env,
    )
    venv = tmp_path / "runner-temp" / "gpucloud-venv"
    assert run.step_outputs["install"] == {"python": str(venv / "bin" / "python")}, run.log
    assert f"gpucloud {version} on Python 3." in run.log
    package = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import gpucloud; print(gpucloud.__file__)"],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            cwd=tmp_path,
            check=True,
        ).stdout.strip()
    ).parent
    assert package.is_relative_to(venv) and package.parent.name == "site-packages", package
    for part in (
        "providers/aws/__init__.py",
        "providers/azure/__init__.py",
        "templates/shim.sh.j2",
        "catalog/data/offerings.csv",
    ):
        assert (package / part).is_file(), part
    assert not list(package.parent.glob("__editable__*")), "an editable install, not the wheel"
    assert run.failed_step == "Run the job"  # no dependencies in that venv (--no-deps): only the install is checked


def test_install_false_with_an_interpreter_lacking_gpucloud_fails_clearly(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    run = run_action(
        {"spec": "x.yaml", "install": "false", "python": "python3"},
        ws,
        tmp_path,
        env_extra={"PYTHONPATH": "", "PATH": "/usr/bin:/bin"},
    )
    if run.failed_step is None:  # the system python happens to have gpucloud installed
        pytest.skip("/usr/bin/python3 imports gpucloud")
    assert run.failed_step == "Install gpucloud"
    assert "cannot import gpucloud; set install to true" in run.log


def test_workflow_commands_printed_by_the_job_are_fenced(workspace: Path, tmp_path: Path) -> None:
    """The job's `::add-mask::`, `::stop-commands::`, `::set-output`, `::error` lines sit between
    `::stop-commands::<random token>` and `::<token>::`: the runner shows them and runs none."""
    (workspace / "jobs" / "sly.yaml").write_text(
        "name: sly\nresources:\n  cloud: local\nmax_duration: 2m\nrun: |\n"
        "  echo '::add-mask::hunter2'\n  echo '::stop-commands::guess'\n  echo '::set-output name=exit-code::0'\n"
        "  printf 'no newline then ::error::mid-line'\n  echo\n  echo '::error title=forged::from the job'\n"
    )
    run = run_action(local_inputs("jobs/sly.yaml"), workspace, tmp_path)
    assert run.failed_step is None, run.log
    lines = run.log.splitlines()
    fenced: set[int] = set()  # line numbers inside a fence (the job's output is fenced chunk by chunk)
    tokens = []
    for start, line in enumerate(lines):
        if re.fullmatch(r"::stop-commands::[0-9a-f]{32}", line):
            tokens.append(line.rsplit("::", 1)[1])
            end = lines.index(f"::{tokens[-1]}::", start)
            assert not any(re.fullmatch(r"::(end)?group::.*", x) for x in lines[start:end]), run.log
            fenced.update(range(start + 1, end))
    assert tokens and len(set(tokens)) == len(tokens), run.log  # a fresh random token each time
    for forged in (
        "::add-mask::hunter2",
        "::stop-commands::guess",
        "::set-output name=exit-code::0",
        "::error title=forged::from the job",
    ):
        assert next(i for i, line in enumerate(lines) if line == forged) in fenced, run.log
        assert lines.count(forged) == 1  # nowhere outside a fence
    assert any(line == "::endgroup::" for i, line in enumerate(lines) if i not in fenced)
    assert run.outputs["exit-code"] == "0" and run.outputs["status"] == "succeeded"


def test_spot_input_is_escaped_in_the_error_it_is_echoed_into(workspace: Path, tmp_path: Path) -> None:
    run = run_action(local_inputs("jobs/quickstart.yaml", spot="maybe\n::add-mask::x%41"), workspace, tmp_path)
    assert run.failed_step == "Run the job" and run.exit_status == 2
    assert "not 'maybe%0A::add-mask::x%2541'." in run.log, run.log
    assert not any(line.startswith("::add-mask::") for line in run.log.splitlines())


def test_every_line_of_a_multi_line_args_input_is_used(workspace: Path, tmp_path: Path) -> None:
    run = run_action(local_inputs("jobs/quickstart.yaml", args="--yes\n--bogus-flag"), workspace, tmp_path)
    assert run.failed_step == "Run the job" and run.exit_status == 2
    assert "--bogus-flag" in run.log, run.log  # the second line reached the CLI (before: dropped silently)
