"""Static checks of action.yml and examples/ci/: actionlint on the example workflow (also with the
action resolved from this checkout, which makes actionlint check action.yml's metadata and the
workflow's `with:` inputs against it), the action metadata rules GitHub enforces, shellcheck on the
action's scripts, and the shape of the GitLab example."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
ACTION = REPO / "action.yml"
GH_EXAMPLE = REPO / "examples" / "ci" / "github-actions.yml"
GL_EXAMPLE = REPO / "examples" / "ci" / "gitlab-ci.yml"
REMOTE_REF = "OWNER/gpucloud@v0.1.0"
LONG_LIVED_KEYS = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_ACCESS_KEY_ID",
    "AZURE_CLIENT_SECRET",
    "aws-secret-access-key",
    "aws-access-key-id",
    "creds:",
    "client-secret",
)

needs_actionlint = pytest.mark.skipif(
    shutil.which("actionlint") is None, reason="actionlint not installed (pip install '.[test]' brings it)"
)


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def actionlint(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["actionlint", "-no-color", "-oneline", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@needs_actionlint
def test_actionlint_passes_on_the_example_workflow() -> None:
    proc = actionlint(str(GH_EXAMPLE), cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def local_project(tmp_path: Path, workflow_text: str, action_text: str | None = None) -> Path:
    """A repository whose workflow uses this action as `./` (actionlint then reads action.yml)."""
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    (tmp_path / "action.yml").write_text(action_text if action_text is not None else ACTION.read_text())
    (tmp_path / ".github" / "workflows" / "gpucloud.yml").write_text(workflow_text)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    return tmp_path


@needs_actionlint
def test_actionlint_checks_the_action_through_the_example(tmp_path: Path) -> None:
    text = GH_EXAMPLE.read_text()
    assert REMOTE_REF in text
    project = local_project(tmp_path, text.replace(REMOTE_REF, "./"))
    proc = actionlint(cwd=project)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_actionlint
def test_actionlint_would_catch_a_wrong_input_or_broken_metadata(tmp_path: Path) -> None:
    """The check above is not vacuous: actionlint does read action.yml through `uses: ./`."""
    text = GH_EXAMPLE.read_text().replace(REMOTE_REF, "./").replace("spec: jobs/train.yaml", "spek: jobs/train.yaml")
    broken = ACTION.read_text().replace("shell: bash\n", "shell: bash\n      uses-not: x\n", 1)
    proc = actionlint(cwd=local_project(tmp_path, text, broken))
    assert proc.returncode == 1
    assert 'input "spek" is not defined in action "gpucloud run"' in proc.stdout
    assert 'unexpected key "uses-not"' in proc.stdout


def test_action_metadata_rules() -> None:
    """What GitHub requires of a composite action's metadata (docs/CI.md, "The action")."""
    action = load(ACTION)
    assert isinstance(action["name"], str) and isinstance(action["description"], str)
    assert set(action) <= {"name", "author", "description", "inputs", "outputs", "runs", "branding"}
    assert set(action["inputs"]) >= {"spec", "cloud", "region", "spot", "version", "args"}
    for name, spec in action["inputs"].items():
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", name), name
        assert set(spec) <= {"description", "required", "default", "deprecationMessage"}, name
        assert isinstance(spec["description"], str), name
        assert spec.get("required", False) or "default" in spec, f"{name}: optional input without a default"
    assert action["inputs"]["spec"]["required"] is True
    assert set(action["outputs"]) >= {"run-id", "exit-code", "cost", "artifacts-dir"}
    runs = action["runs"]
    assert runs["using"] == "composite" and set(runs) == {"using", "steps"}
    ids = [s["id"] for s in runs["steps"] if "id" in s]
    assert len(ids) == len(set(ids))
    for step in runs["steps"]:
        assert ("run" in step) != ("uses" in step), step.get("name")
        if "run" in step:
            assert step.get("shell") in {"bash", "sh", "python", "pwsh", "powershell", "cmd"}, step.get("name")
            # inputs reach scripts through env only (no expression inside a script: no injection)
            assert "${{" not in step["run"], step.get("name")
    for name, spec in action["outputs"].items():  # composite outputs need a value from a step
        assert isinstance(spec["description"], str), name
        match = re.fullmatch(r"\$\{\{ steps\.([\w-]+)\.outputs\.([\w-]+) \}\}", spec["value"])
        assert match and match.group(1) in ids, name
    used = set(re.findall(r"\$\{\{ inputs\.([\w-]+) \}\}", ACTION.read_text()))
    assert used <= set(action["inputs"]), used - set(action["inputs"])
    assert set(action["inputs"]) <= used, "an input nothing reads"


def test_action_scripts_pass_shellcheck(tmp_path: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed")
    for index, step in enumerate(load(ACTION)["runs"]["steps"]):
        env = "".join(f'{k}="${{{k}:-}}"; export {k}\n' for k in step.get("env") or {})
        script = tmp_path / f"step{index}.sh"
        script.write_text(f"#!/usr/bin/env bash\nset -eo pipefail\n{env}{step['run']}")
        proc = subprocess.run([shellcheck, "-s", "bash", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


def test_github_example_flow_and_oidc() -> None:
    wf = load(GH_EXAMPLE)
    triggers = wf[True] if True in wf else wf["on"]  # YAML 1.1 reads a bare `on` as true
    assert "pull_request" in triggers and triggers["push"]["branches"] == ["main"]
    check, train = wf["jobs"]["validate-and-plan"], wf["jobs"]["train"]
    assert "pull_request" in check["if"] and "push" in train["if"]
    check_runs = "\n".join(s.get("run", "") for s in check["steps"])
    assert "gpucloud validate" in check_runs and "plan-summary" in check_runs and "GITHUB_STEP_SUMMARY" in check_runs
    assert train["permissions"]["id-token"] == "write"
    uses = {s["uses"].split("@")[0]: s for s in train["steps"] if "uses" in s}
    assert "role-to-assume" in uses["aws-actions/configure-aws-credentials"]["with"]
    assert {"client-id", "tenant-id", "subscription-id"} <= set(uses["azure/login"]["with"])
    run_step = uses["OWNER/gpucloud"]
    assert run_step["with"]["spec"] and run_step["id"] == "gpucloud"
    upload = uses["actions/upload-artifact"]
    assert "steps.gpucloud.outputs.artifacts-dir" in upload["with"]["path"]
    text = GH_EXAMPLE.read_text()
    assert not [k for k in LONG_LIVED_KEYS if k in text]
    assert "secrets." not in text


def test_gitlab_example_flow_and_oidc() -> None:
    gl = load(GL_EXAMPLE)
    stages = gl["stages"]
    jobs = {k: v for k, v in gl.items() if isinstance(v, dict) and "script" in v}
    assert set(jobs) == {"validate", "plan", "train"}
    for name, job in jobs.items():
        assert job["stage"] in stages, name
        assert isinstance(job["script"], list) and job["rules"], name
    for name in ("validate", "plan"):
        assert jobs[name]["rules"][0]["if"] == '$CI_PIPELINE_SOURCE == "merge_request_event"'
    assert "$CI_DEFAULT_BRANCH" in jobs["train"]["rules"][0]["if"]
    assert "gpucloud validate" in " ".join(jobs["validate"]["script"])
    plan = jobs["plan"]
    assert "plan-summary" in " ".join(plan["script"]) and plan["artifacts"]["expose_as"]
    train = jobs["train"]
    assert set(train["id_tokens"]) == {"AWS_ID_TOKEN", "AZURE_ID_TOKEN"}
    assert train["id_tokens"]["AWS_ID_TOKEN"]["aud"] == "sts.amazonaws.com"
    assert train["id_tokens"]["AZURE_ID_TOKEN"]["aud"] == "api://AzureADTokenExchange"
    assert {"AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AZURE_FEDERATED_TOKEN_FILE"} <= set(train["variables"])
    assert train["artifacts"]["reports"]["dotenv"] == train["variables"]["GPUCLOUD_DOTENV"]
    assert train["artifacts"]["when"] == "always"
    text = GL_EXAMPLE.read_text()
    assert not [k for k in LONG_LIVED_KEYS if k in text]
