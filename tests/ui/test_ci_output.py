"""gpucloud/ui/ci.py: workflow-command escaping, annotations, groups/sections, the step summary,
the GitLab dotenv report, and the helpers the action and the example workflows call."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from gpucloud.errors import NoCandidateError, UserError
from gpucloud.spec.load import SpecError, SpecIssue
from gpucloud.ui import ci as ci_output
from tests.support.cli import cli

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test chooses its CI; none leaks from the machine running the tests."""
    for name in (
        "GITHUB_ACTIONS",
        "GITLAB_CI",
        "GITHUB_STEP_SUMMARY",
        "GITHUB_WORKSPACE",
        "GITHUB_OUTPUT",
        "GPUCLOUD_DOTENV",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(ci_output, "_open_section", None)


def test_detect() -> None:
    assert ci_output.detect({}) is None
    assert ci_output.detect({"GITHUB_ACTIONS": "true"}) == "github"
    assert ci_output.detect({"GITLAB_CI": "true"}) == "gitlab"
    assert ci_output.detect({"GITHUB_ACTIONS": "false", "CI": "true"}) is None


def test_escaping_follows_githubs_rules() -> None:
    assert ci_output.escape_data("50% done\r\nnext") == "50%25 done%0D%0Anext"
    assert ci_output.escape_data("a:b,c") == "a:b,c"  # the message keeps : and ,
    assert ci_output.escape_property("dir,x/a:b%\n") == "dir%2Cx/a%3Ab%25%0A"


def test_annotation_shapes() -> None:
    assert (
        ci_output.annotation("bad\nthing", file="jobs/a,b.yaml", line=3, title="gpucloud: name")
        == "::error file=jobs/a%2Cb.yaml,line=3,title=gpucloud%3A name::bad%0Athing"
    )
    assert ci_output.annotation("plain") == "::error::plain"
    assert ci_output.annotation("w", level="warning", line=None, title="t") == "::warning title=t::w"


def test_workspace_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    job = tmp_path / "jobs" / "a.yaml"
    env = {"GITHUB_WORKSPACE": str(tmp_path)}
    assert ci_output.workspace_path(str(job), env) == "jobs/a.yaml"
    assert ci_output.workspace_path("/elsewhere/a.yaml", env) == "/elsewhere/a.yaml"
    assert ci_output.workspace_path("x.yaml", {}) == "x.yaml"


def spec_error() -> SpecError:
    return SpecError(
        [
            SpecIssue("jobs/a.yaml", 7, "resources.gpu", "'Z80' is not a GPU. Did you mean 'K80'?"),
            SpecIssue("jobs/a.yaml", None, "", "invalid YAML: something."),
        ]
    )


def test_error_annotations_one_per_problem() -> None:
    lines = ci_output.error_annotations(spec_error(), {})
    assert lines == [
        "::error file=jobs/a.yaml,title=gpucloud%3A job file::invalid YAML: something.",
        "::error file=jobs/a.yaml,line=7,title=gpucloud%3A resources.gpu::'Z80' is not a GPU. Did you mean 'K80'?",
    ]
    other = ci_output.error_annotations(NoCandidateError("none left:", ["aws/us-east-1/p2.xlarge: quota"]), {})
    assert other == ["::error title=gpucloud%3A no-candidate error::none left:%0A  - aws/us-east-1/p2.xlarge: quota"]


def test_error_details_match_the_json_error_shape() -> None:
    assert ci_output.error_details(spec_error())[1] == {
        "file": "jobs/a.yaml",
        "line": 7,
        "field": "resources.gpu",
        "message": "'Z80' is not a GPU. Did you mean 'K80'?",
    }
    assert ci_output.error_details(UserError("x")) == []
    assert ci_output.error_kind(spec_error()) == "spec"
    assert ci_output.error_kind(UserError("x")) == "user"


def test_report_error_on_github(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    ci_output.report_error(spec_error(), "validate")
    err = capsys.readouterr().err
    assert err.count("::error file=jobs/a.yaml") == 2
    text = summary.read_text()
    assert text.startswith("### ❌ gpucloud validate: spec error (exit 2)")
    assert "| `jobs/a.yaml` | 7 | `resources.gpu` | 'Z80' is not a GPU. Did you mean 'K80'? |" in text


def test_report_error_on_gitlab_writes_dotenv_only_for_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    dotenv = tmp_path / "out.env"
    monkeypatch.setenv("GITLAB_CI", "true")
    monkeypatch.setenv("GPUCLOUD_DOTENV", str(dotenv))
    ci_output.report_error(UserError("bad flag"), "plan")
    assert not dotenv.exists()
    ci_output.report_error(NoCandidateError("none\nleft", []), "run")
    assert dotenv.read_text() == "GPUCLOUD_STATUS=error\nGPUCLOUD_EXIT_CODE=75\nGPUCLOUD_ERROR=none left\n"


def test_nothing_happens_outside_ci(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    ci_output.report_error(spec_error(), "run")
    ci_output.phase_changed("provision")
    ci_output.report_run({"run_id": "x", "status": "succeeded", "exit_code": 0})
    assert capsys.readouterr().err == "" and list(tmp_path.iterdir()) == []


def test_groups_open_and_close_in_pairs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    ci_output.phase_changed("provision")
    ci_output.phase_changed("provision")  # same phase again: nothing
    ci_output.phase_changed("run")  # a new phase closes the open group first
    ci_output.phase_finished("setup")  # not the open one: nothing
    ci_output.phase_finished("run")
    ci_output.phase_changed(None)  # nothing open: nothing
    assert capsys.readouterr().err.splitlines() == [
        "::group::provision",
        "::endgroup::",
        "::group::run",
        "::endgroup::",
    ]


def test_gitlab_sections() -> None:
    assert (
        ci_output.section_start("fetch code", "gitlab", now=1700000000)
        == "\x1b[0Ksection_start:1700000000:gpucloud_fetch_code[collapsed=true]\r\x1b[0Kfetch code"
    )
    assert (
        ci_output.section_start("run", "gitlab", now=1, collapsed=False)
        == "\x1b[0Ksection_start:1:gpucloud_run\r\x1b[0Krun"
    )
    assert (
        ci_output.section_end("fetch code", "gitlab", now=1700000009)
        == "\x1b[0Ksection_end:1700000009:gpucloud_fetch_code\r\x1b[0K"
    )


RESULT = {
    "run_id": "job-20260101-000000-abcd",
    "status": "succeeded",
    "exit_code": 0,
    "artifacts_dir": None,
    "phases": {"plan": 0.01, "provision": 61.5, "run": 3600.0},
    "cost": 0.5261234,
}


def test_run_markdown_and_fields(tmp_path: Path) -> None:
    arts = tmp_path / "arts"
    (arts / "out").mkdir(parents=True)
    (arts / "metrics.json").write_text("{}")
    (arts / "out" / "m.bin").write_bytes(b"x" * 2048)
    result = {**RESULT, "artifacts_dir": str(arts)}
    text = ci_output.run_markdown(result, "aws/us-east-1/g4dn.xlarge x 1 node(s)")
    assert text.startswith("### ✅ gpucloud run `job-20260101-000000-abcd`: succeeded")
    for row in (
        "| where | aws/us-east-1/g4dn.xlarge x 1 node(s) |",
        "| exit code | 0 |",
        "| cost | $0.5261 |",
        f"| artifacts | `{arts}` |",
        "| provision | 61.5 |",
        "| **total** | **3661.5** |",
        "| `out/m.bin` | 2,048 B |",
        "| `metrics.json` | 2 B |",
    ):
        assert row in text, row
    detached = ci_output.run_markdown({**RESULT, "status": "detached", "exit_code": None, "phases": {}}, "")
    assert "⏳" in detached and "| exit code | none (detached) |" in detached and "not provisioned" in detached
    fields = ci_output.run_fields(result, "aws/us-east-1/g4dn.xlarge x 1 node(s)")
    assert fields["GPUCLOUD_COST"] == "0.5261" and fields["GPUCLOUD_EXIT_CODE"] == 0
    assert fields["GPUCLOUD_STAGE_TIMES"] == "plan=0.0s provision=61.5s run=3600.0s"


def test_dotenv_format_follows_gitlabs_rules() -> None:
    text = ci_output.format_dotenv({"A": "x\ny", "B_2": ' "quoted" ', "C": 3})
    assert text == 'A=x y\nB_2="quoted"\nC=3\n'
    with pytest.raises(ValueError):
        ci_output.format_dotenv({"BAD-KEY": "x"})


def test_action_outputs_from_each_document_shape() -> None:
    ok = ci_output.action_outputs(RESULT, 0)
    assert ok == {
        "run-id": RESULT["run_id"],
        "status": "succeeded",
        "exit-code": "0",
        "cost": "0.5261",
        "artifacts-dir": "",
    }
    error = {"error": {"exit_code": 75, "kind": "no-candidate", "message": "m", "hint": None, "details": []}}
    assert ci_output.action_outputs(error, 75)["exit-code"] == "75"
    assert ci_output.action_outputs({}, 2) == {
        "run-id": "",
        "status": "error",
        "exit-code": "2",
        "cost": "",
        "artifacts-dir": "",
    }
    detached = {**RESULT, "status": "detached", "exit_code": None}
    assert ci_output.action_outputs(detached, 0)["exit-code"] == ""


def test_module_cli_writes_outputs_and_plan_summary(tmp_path: Path) -> None:
    result = tmp_path / "r.json"
    result.write_text(json.dumps(RESULT))
    out = tmp_path / "gh-out"
    env = {**os.environ, "GITHUB_OUTPUT": str(out)}
    cli("action-outputs", str(result), "0", module="gpucloud.ui.ci", env=env, timeout=None, check=True, text=False)
    assert out.read_text().splitlines() == [
        f"run-id={RESULT['run_id']}",
        "status=succeeded",
        "exit-code=0",
        "cost=0.5261",
        "artifacts-dir=",
    ]
    plan = cli("plan", str(REPO / "examples" / "quickstart.yaml"), "--json", timeout=None, check=True).stdout
    (tmp_path / "plan.json").write_text(plan)
    md = cli("plan-summary", str(tmp_path / "plan.json"), module="gpucloud.ui.ci", timeout=None, check=True).stdout
    first = json.loads(plan)["candidates"][0]
    assert md.startswith(
        f"### gpucloud plan: ${first['estimated_cost']:.2f} at most on "
        f"{first['cloud']}/{first['region']}/{first['instance_type']}"
    )
    assert "| 1 | " in md and "| 5 | " in md and "more fallback candidate(s)" in md
    bad = cli("nonsense", module="gpucloud.ui.ci", timeout=None)
    assert bad.returncode == 2 and "usage:" in bad.stderr


@pytest.mark.slow
def test_run_on_gitlab_sections_and_dotenv(tmp_path: Path) -> None:
    """`gpucloud run` under GITLAB_CI=true: phases as sections, the dotenv report at GPUCLOUD_DOTENV."""
    shutil.copy(REPO / "examples" / "quickstart.yaml", tmp_path / "job.yaml")
    shutil.copytree(REPO / "examples" / "quickstart", tmp_path / "quickstart")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    env.update(
        {"GITLAB_CI": "true", "CI": "true", "GPUCLOUD_DOTENV": str(tmp_path / "report.env"), "PYTHONPATH": str(REPO)}
    )
    proc = cli(
        "run", "job.yaml", "--cloud", "local", env=env, cwd=tmp_path, timeout=300, text=False
    )  # bytes: text mode would turn \r into \n
    stderr = proc.stderr.decode()
    assert proc.returncode == 0, stderr
    starts = re.findall(r"\x1b\[0Ksection_start:\d+:(gpucloud_\w+)(\[collapsed=true\])?\r\x1b\[0K", stderr)
    ends = re.findall(r"\x1b\[0Ksection_end:\d+:(gpucloud_\w+)\r\x1b\[0K", stderr)
    assert ("gpucloud_provision", "[collapsed=true]") in starts and ("gpucloud_run", "") in starts
    assert [s for s, _ in starts] == ends
    fields = dict(line.split("=", 1) for line in (tmp_path / "report.env").read_text().splitlines())
    assert fields["GPUCLOUD_STATUS"] == "succeeded" and fields["GPUCLOUD_EXIT_CODE"] == "0"
    assert fields["GPUCLOUD_WHERE"] == "local/local/localhost x 1 node(s)" and fields["GPUCLOUD_COST"] == "0.0000"
    assert Path(fields["GPUCLOUD_ARTIFACTS_DIR"], "metrics.json").is_file()
    assert fields["GPUCLOUD_RUN_ID"].startswith("quickstart-") and "provision=" in fields["GPUCLOUD_STAGE_TIMES"]


@pytest.mark.slow
def test_step_summary_escapes_backticks_and_html_from_the_job(tmp_path: Path) -> None:
    """`gpucloud run` under GITHUB_ACTIONS=true, a job whose artifact names and run output carry
    backticks, pipes and HTML: the step summary renders them as text (checked with a CommonMark
    + tables parser), never as markup, and says that artifacts were refused."""
    from markdown_it import MarkdownIt

    evil = "x`y|z<img src=x onerror=alert(1)>.txt"
    job = tmp_path / "job.yaml"
    job.write_text(
        json.dumps(
            {
                "name": "evil",
                "resources": {"cloud": "local"},
                "max_duration": "2m",
                "artifacts": ["out/"],
                "run": f"mkdir -p out; echo 1 > 'out/{evil}'; ln -s /etc/passwd 'out/<b>link'",
            }
        )
    )
    summary = tmp_path / "summary.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "GITLAB_"))}
    env.update({"GITHUB_ACTIONS": "true", "CI": "true", "GITHUB_STEP_SUMMARY": str(summary), "PYTHONPATH": str(REPO)})
    proc = cli("run", str(job), "--cloud", "local", env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    html = MarkdownIt("commonmark").enable("table").render(summary.read_text())
    assert "<img" not in html and "<b>" not in html, html
    assert "<code>out/x`y|z&lt;img src=x onerror=alert(1)&gt;.txt</code>" in html, html
    assert "1 artifact member(s) not extracted" in html and "&lt;b&gt;link" in html, html


def test_markdown_cells_and_code_spans_cannot_be_broken_out_of() -> None:
    from markdown_it import MarkdownIt

    parse = MarkdownIt("commonmark").enable("table").render
    for text in ("a`b", "``", "`x", "x|y", "<script>alert(1)</script>", "[link](https://evil)", "**bold** _i_"):
        row = f"| {ci_output.code_span(text)} | {ci_output.md(text)} |"
        html = parse(f"| a | b |\n|---|---|\n{row}\n")
        assert html.count("<td>") == 2 and "<script" not in html and "<a " not in html and "<strong>" not in html, html
    block = ci_output.code_block("x\n```\n<b>y</b>")
    assert parse(block).count("<pre>") == 1 and "<b>" not in parse(block)
