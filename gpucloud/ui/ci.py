"""Native output for CI systems, so a run reads well where it is watched (docs/CI.md).

GitHub Actions (`GITHUB_ACTIONS=true`): job-file problems become `::error file=,line=::` annotations
on the PR diff, each run phase a collapsible `::group::`, and the run's summary (where it ran, stage
times, cost, exit code, artifacts) is appended to `$GITHUB_STEP_SUMMARY` as markdown.
GitLab CI (`GITLAB_CI=true`): each phase a collapsible log section, and a dotenv report
(`$GPUCLOUD_DOTENV`, default `gpucloud.env`) with the same fields for later jobs.

Everything here is best effort: CI decoration must never turn a good run into a failure, so file
errors are swallowed. Markers go to stderr (stdout holds `--json` documents); both runners read
workflow commands and section markers from either stream. Outside CI every hook does nothing.

`python -m gpucloud.ui.ci action-outputs RESULT.json EXIT_CODE` writes the GitHub Action's
outputs; `python -m gpucloud.ui.ci plan-summary PLAN.json` prints a plan as markdown.
"""

from __future__ import annotations

import atexit
import codecs
import json
import os
import re
import secrets
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from gpucloud.errors import error_kind

GITHUB = "github"
GITLAB = "gitlab"
DEFAULT_DOTENV = "gpucloud.env"
MAX_ARTIFACT_ROWS = 20
_open_section: str | None = None  # the phase whose group/section is open in this process


def detect(env: Mapping[str, str] | None = None) -> str | None:
    """Which CI runs us: "github", "gitlab" or None (both set their variable to "true")."""
    env = os.environ if env is None else env
    if env.get("GITHUB_ACTIONS", "").lower() == "true":
        return GITHUB
    if env.get("GITLAB_CI", "").lower() == "true":
        return GITLAB
    return None


# ---- GitHub workflow commands ------------------------------------------------------------------


def escape_data(text: str) -> str:
    """A command's message: GitHub's runner un-escapes %25, %0D and %0A (in that spirit, % first)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A command's property value: additionally `:` and `,`, which delimit properties."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(
    message: str, *, level: str = "error", file: str | None = None, line: int | None = None, title: str | None = None
) -> str:
    """One `::error file=..,line=..,title=..::message` workflow command."""
    props = [
        f"{key}={escape_property(str(value))}"
        for key, value in (("file", file), ("line", line), ("title", title))
        if value not in (None, "")
    ]
    return f"::{level}{' ' + ','.join(props) if props else ''}::{escape_data(message)}"


def workspace_path(path: str, env: Mapping[str, str] | None = None) -> str:
    """An annotation's file must be relative to the repository root ($GITHUB_WORKSPACE) for GitHub
    to attach it to the diff; a path outside it is left as given."""
    env = os.environ if env is None else env
    root = env.get("GITHUB_WORKSPACE")
    if not root:
        return path
    try:
        return Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
    except (ValueError, OSError):
        return path


class LogFence:
    """A stream for the job's output. Under GitHub Actions the output is written between
    `::stop-commands::<token>` and `::<token>::`, so workflow commands the job prints
    (`::add-mask::`, `::set-output`, `::stop-commands::`) are shown, never run. The token is random
    per fence: the job cannot end it. The fence closes before gpucloud's own markers and at exit."""

    def __init__(self, stream: BinaryIO, env: Mapping[str, str] | None = None) -> None:
        self.stream = stream
        self.enabled = detect(env) == GITHUB
        self.clean = detect(env) is not None  # in any CI log the job's escapes are made visible
        self.token: str | None = None
        self._at_line_start = True
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._cr = False  # the last piece ended with a CR: a LF that starts the next one ends the same line

    def write(self, data: bytes) -> None:
        if self.clean:
            data = self._cleaned(data)
        if not data:
            return
        if self.enabled and self.token is None:
            self.token = secrets.token_hex(16)
            self._raw(f"::stop-commands::{self.token}\n".encode(), marker=True)
            _fences.append(self)
        self._raw(data)

    def _cleaned(self, data: bytes) -> bytes:
        """The job's bytes with escape sequences and other controls shown as `\\xNN` (a terminal
        escape could retitle, hide or rewrite what the CI log shows); a CR ends a line, as the
        runner reads it, so a progress bar's updates are lines of their own."""
        from gpucloud.ui.untrusted import shown_stream  # only in CI: `plan` and `catalog` start without it

        text = self._decoder.decode(data)
        if self._cr and text.startswith("\n"):
            text = text[1:]
        self._cr = text.endswith("\r")
        return shown_stream(text.replace("\r\n", "\n").replace("\r", "\n")).encode()

    def flush(self) -> None:
        self.stream.flush()

    def close(self) -> None:
        """Resume workflow commands (a no-op when no fence is open)."""
        if self.token is None:
            return
        token, self.token = self.token, None
        try:
            self._raw(f"::{token}::\n".encode(), marker=True)
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def _raw(self, data: bytes, *, marker: bool = False) -> None:
        if marker and not self._at_line_start:
            data = b"\n" + data  # a workflow command counts only at the start of a line
        self.stream.write(data)
        self._at_line_start = data.endswith(b"\n")


_fences: list[LogFence] = []


@atexit.register
def close_fences() -> None:
    """Close every open fence (before gpucloud writes a marker of its own, and at exit)."""
    while _fences:
        _fences.pop().close()


# ---- errors ---------------------------------------------------------------------------------------


def error_details(exc: BaseException) -> list[dict[str, Any]]:
    """Each job-file problem as {"file", "line", "field", "message"} (the `details` of a --json error)."""
    return [
        {"file": i.file, "line": i.line, "field": i.field, "message": i.message}
        for i in getattr(exc, "issues", None) or []
    ]


def error_annotations(exc: BaseException, env: Mapping[str, str] | None = None) -> list[str]:
    """Workflow commands for an error: one per job-file problem (with file and line), else one."""
    details = error_details(exc)
    if details:
        return [
            annotation(
                d["message"],
                file=workspace_path(d["file"], env),
                line=d["line"],
                title=f"gpucloud: {d['field']}" if d["field"] else "gpucloud: job file",
            )
            for d in details
        ]
    render = getattr(exc, "render", None)
    text = render() if callable(render) else str(exc)
    return [annotation(text, title=f"gpucloud: {error_kind(exc)} error")]


def report_error(exc: BaseException, command: str | None = None) -> None:
    """CLI hook: `command` failed with a GpucloudError. GitHub: annotations plus a summary block;
    GitLab: a `run` that failed before it had a result still writes its dotenv report."""
    ci = detect()
    if ci is None:
        return
    if ci == GITHUB:
        for line in error_annotations(exc):
            _emit(line)
        _append_summary(error_markdown(exc, command))
    elif command == "run":
        code = getattr(exc, "exit_code", 70)
        write_dotenv(
            {
                "GPUCLOUD_STATUS": "error",
                "GPUCLOUD_EXIT_CODE": code,
                "GPUCLOUD_ERROR": getattr(exc, "message", str(exc)),
            }
        )


def error_markdown(exc: BaseException, command: str | None) -> str:
    """The summary block of a failed command: what failed, and each problem with file and line."""
    code = getattr(exc, "exit_code", 70)
    head = f"### ❌ gpucloud{' ' + command if command else ''}: {error_kind(exc)} error (exit {code})"
    details = error_details(exc)
    if details:
        rows = [
            f"| {code_span(workspace_path(d['file']))} | {d['line'] or ''} "
            f"| {code_span(d['field'])} | {md(d['message'])} |"
            for d in details
        ]
        return "\n".join([head, "", "| file | line | field | problem |", "|---|---|---|---|", *rows, ""])
    render = getattr(exc, "render", None)
    text = render() if callable(render) else str(exc)
    return f"{head}\n\n{code_block(text)}\n"


# ---- phases: groups and sections ------------------------------------------------------------------


def section_start(name: str, ci: str, *, now: float | None = None, collapsed: bool = True) -> str:
    if ci == GITHUB:
        return f"::group::{escape_data(name)}"
    stamp = int(time.time() if now is None else now)
    flag = "[collapsed=true]" if collapsed else ""
    return f"\x1b[0Ksection_start:{stamp}:{_section_id(name)}{flag}\r\x1b[0K{name}"


def section_end(name: str, ci: str, *, now: float | None = None) -> str:
    if ci == GITHUB:
        return "::endgroup::"
    stamp = int(time.time() if now is None else now)
    return f"\x1b[0Ksection_end:{stamp}:{_section_id(name)}\r\x1b[0K"


def _section_id(name: str) -> str:
    """GitLab section names allow letters, digits, `_`, `.` and `-`."""
    return "gpucloud_" + re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def phase_changed(name: str | None) -> None:
    """Progress hook: the run entered phase `name` (None: no phase any more). Closes the open
    group first; GitHub groups do not nest. The job's own `run` stage stays expanded on GitLab."""
    global _open_section
    ci = detect()
    if ci is None or name == _open_section:
        return
    if _open_section is not None:
        _emit(section_end(_open_section, ci))
        _open_section = None
    if name is not None:
        _emit(section_start(name, ci, collapsed=name != "run"))
        _open_section = name


def phase_finished(name: str) -> None:
    """Progress hook: phase `name` ended (its "done in" line is printed): close its group."""
    if _open_section == name:
        phase_changed(None)


def _emit(line: str) -> None:
    """A marker line on stderr, after whatever job output is pending on stdout (whose fence is
    closed first: a marker inside it would not be read)."""
    try:
        close_fences()
        sys.stdout.flush()
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


# ---- the end of a run: summary and dotenv ---------------------------------------------------------


def report_run(result: Mapping[str, Any]) -> None:
    """CLI hook at the end of `run` (the --json result document): the step summary on GitHub,
    the dotenv report on GitLab."""
    ci = detect()
    if ci is None:
        return
    where = _where(str(result.get("run_id") or ""))
    if ci == GITHUB:
        _append_summary(run_markdown(result, where))
    else:
        write_dotenv(run_fields(result, where))


def _where(run_id: str) -> str:
    """`cloud/region/instance_type x N node(s)` from the state database (the result lacks it)."""
    try:
        from gpucloud.state.runs_db import Store

        run = Store().get_run(run_id)
    except Exception:  # best effort: the summary is written without it
        return ""
    if run is None or not run.cloud:
        return ""
    return f"{run.cloud}/{run.region}/{run.instance_type} x {run.num_nodes} node(s)"


def run_fields(result: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The summary's fields as GPUCLOUD_* variables (the dotenv report)."""
    phases = result.get("phases") or {}
    code = result.get("exit_code")
    return {
        "GPUCLOUD_RUN_ID": result.get("run_id") or "",
        "GPUCLOUD_STATUS": result.get("status") or "",
        "GPUCLOUD_EXIT_CODE": "" if code is None else code,
        "GPUCLOUD_WHERE": where,
        "GPUCLOUD_COST": _cost(result.get("cost")),
        "GPUCLOUD_ARTIFACTS_DIR": result.get("artifacts_dir") or "",
        "GPUCLOUD_STAGE_TIMES": " ".join(f"{k}={float(v):.1f}s" for k, v in phases.items()),
    }


def _cost(value: Any) -> str:
    try:
        return f"{float(value):.4f}"
    except (TypeError, ValueError):
        return ""


_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~!])")


def md(text: Any) -> str:
    """Text safe inside a markdown table cell: HTML escaped, markdown punctuation backslashed,
    one line (a job's names and messages must not add markup, links or images to the summary)."""
    plain = " ".join(str(text).splitlines()).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", plain)


def code_span(text: Any) -> str:
    """A code span for a table cell that no backtick in `text` can close: the fence is one
    backtick longer than the longest run inside (CommonMark); `|` is escaped for the table."""
    plain = " ".join(str(text).splitlines()).replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall(r"`+", plain)), default=0) + 1)
    pad = " " if plain.startswith("`") or plain.endswith("`") else ""
    return f"{fence}{pad}{plain}{pad}{fence}"


def code_block(text: str) -> str:
    """A fenced block that no line of `text` can close."""
    fence = "`" * max(3, max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    return f"{fence}\n{text}\n{fence}"


def run_markdown(result: Mapping[str, Any], where: str) -> str:
    """The run's summary: outcome, where, cost, exit code, stage times and artifacts."""
    code = result.get("exit_code")
    status = result.get("status") or "unknown"
    icon = "✅" if status == "succeeded" else ("⏳" if status == "detached" else "❌")
    lines = [
        f"### {icon} gpucloud run {code_span(result.get('run_id') or '?')}: {md(status)}",
        "",
        "| | |",
        "|---|---|",
        f"| where | {md(where) or 'not provisioned'} |",
        f"| exit code | {'none (detached)' if code is None else code} |",
        f"| cost | ${_cost(result.get('cost')) or '?'} |",
        f"| artifacts | {code_span(result['artifacts_dir']) if result.get('artifacts_dir') else 'none'} |",
        *(
            [
                (
                    f"| refused | {len(result['artifacts_refused'])} artifact member(s) not extracted: "
                    f"{md('; '.join(result['artifacts_refused'][:3]))} |"
                )
            ]
            if result.get("artifacts_refused")
            else []
        ),
        "",
    ]
    phases = result.get("phases") or {}
    if phases:
        lines += ["| stage | seconds |", "|---|---:|"]
        lines += [f"| {md(name)} | {float(secs):.1f} |" for name, secs in phases.items()]
        lines += [f"| **total** | **{sum(float(s) for s in phases.values()):.1f}** |", ""]
    lines += usage_markdown(result.get("gpu_usage"))
    lines += artifact_markdown(result.get("artifacts_dir"))
    return "\n".join(lines)


def usage_markdown(usage: Mapping[str, Any] | None) -> list[str]:
    """The run's GPU use as a small table (gpucloud/run/gpu_report.py), with the right-sized machine."""
    if not usage:
        return []
    lines = [
        "| GPU use | |",
        "|---|---:|",
        f"| peak memory per GPU | {float(usage['peak_memory_gib']):g} of {float(usage['gpu_memory_gib']):g} GiB |",
        f"| utilisation mean / p95 | {float(usage['util_mean']):g} % / {float(usage['util_p95']):g} % |",
        f"| GPU-idle | {float(usage['gpu_idle_seconds']):g} s |",
    ]
    fit = usage.get("right_size")
    if fit and not fit.get("same_machine") and float(fit.get("saving") or 0) > 0:
        lines.append(
            f"| would have fitted | {code_span(fit['instance_type'])} ({md(fit['gpu_count'])} × {md(fit['gpu'])}): "
            f"${_cost(fit['would_have_cost'])} instead of ${_cost(fit['cost'])} |"
        )
    return [*lines, ""]


def artifact_markdown(artifacts_dir: str | None) -> list[str]:
    """The first files of the artifacts folder with their sizes, and how to keep them."""
    if not artifacts_dir or not Path(artifacts_dir).is_dir():
        return []
    root = Path(artifacts_dir)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    rows = [
        f"| {code_span(p.relative_to(root).as_posix())} | {p.stat().st_size:,} B |" for p in files[:MAX_ARTIFACT_ROWS]
    ]
    more = [f"| … and {len(files) - MAX_ARTIFACT_ROWS} more | |"] if len(files) > MAX_ARTIFACT_ROWS else []
    return [
        "<details><summary>artifacts: " + f"{len(files)} file(s)</summary>",
        "",
        "| file | size |",
        "|---|---:|",
        *rows,
        *more,
        "",
        "Keep them with `actions/upload-artifact` on the action's `artifacts-dir` output.",
        "",
        "</details>",
        "",
    ]


def _append_summary(markdown: str) -> None:
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(markdown.rstrip("\n") + "\n\n")
    except OSError:
        pass


def dotenv_path() -> Path:
    """Where the GitLab dotenv report goes: $GPUCLOUD_DOTENV, else gpucloud.env in the cwd."""
    return Path(os.environ.get("GPUCLOUD_DOTENV") or DEFAULT_DOTENV)


def format_dotenv(fields: Mapping[str, Any]) -> str:
    """GitLab's dotenv rules: KEY=value lines, no blank lines or comments, no multi-line values,
    quotes kept literally (so none are added)."""
    out = []
    for key, value in fields.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"invalid dotenv key {key!r}")
        text = " ".join(str(value).split("\n")).replace("\r", " ").strip()
        out.append(f"{key}={text}")
    return "\n".join(out) + "\n"


def write_dotenv(fields: Mapping[str, Any]) -> None:
    try:
        dotenv_path().write_text(format_dotenv(fields), encoding="utf-8")
    except OSError:
        pass


# ---- helpers for the GitHub Action and the example workflows ----------------------------------------


def read_result(path: str | Path) -> dict[str, Any]:
    """The --json document a command printed (empty or broken: {})."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def action_outputs(doc: Mapping[str, Any], process_code: int) -> dict[str, str]:
    """The action's outputs from `run --json`'s document; an error document ({"error": {...}})
    gives its exit code; with no document at all, the process's own exit code."""
    error = doc.get("error") if isinstance(doc.get("error"), dict) else None
    if error is not None:
        code = error.get("exit_code")
        return {
            "run-id": "",
            "status": "error",
            "exit-code": str(code if code is not None else process_code),
            "cost": "",
            "artifacts-dir": "",
        }
    code = doc.get("exit_code", process_code if not doc else None)
    return {
        "run-id": str(doc.get("run_id") or ""),
        "status": str(doc.get("status") or ("error" if process_code else "")),
        "exit-code": "" if code is None else str(code),
        "cost": _cost(doc.get("cost")),
        "artifacts-dir": str(doc.get("artifacts_dir") or ""),
    }


def write_github_outputs(outputs: Mapping[str, str], path: str) -> None:
    """Append to $GITHUB_OUTPUT; values are single-line, so `key=value` is enough."""
    with open(path, "a", encoding="utf-8") as f:
        for key, value in outputs.items():
            f.write(f"{key}={' '.join(value.splitlines())}\n")


def plan_markdown(plan: Mapping[str, Any], *, limit: int = 5) -> str:
    """`plan --json` as a PR-summary block: the cheapest candidates with $/h and estimated cost."""
    cands = list(plan.get("candidates") or [])
    if not cands:
        err = plan.get("error") or {}
        return f"### gpucloud plan: no candidate\n\n{md(err.get('message', 'nothing matches the job file'))}\n"
    first = cands[0]
    lines = [
        f"### gpucloud plan: ${float(first['estimated_cost']):.2f} at most on "
        f"{md(first['cloud'])}/{md(first['region'])}/{md(first['instance_type'])}",
        "",
        "| # | where | GPU | market | $/h | est. max cost |",
        "|---:|---|---|---|---:|---:|",
    ]
    for i, c in enumerate(cands[:limit], 1):
        gpu = f"{c.get('gpu_count')} x {c.get('gpu')}" if c.get("gpu") else "none"
        lines.append(
            f"| {i} | {md(c['cloud'])}/{md(c['region'])}/{md(c['instance_type'])} x {c.get('num_nodes', 1)} "
            f"| {md(gpu)} | {'spot' if c.get('spot') else 'on-demand'} | {float(c['total_per_hour']):.3f} "
            f"| {float(c['estimated_cost']):.2f} |"
        )
    if len(cands) > limit:
        lines.append(f"| | {len(cands) - limit} more fallback candidate(s) | | | | |")
    stack = plan.get("stack") or {}
    if stack:
        lines += ["", "Stack: " + ", ".join(f"{k} {md(v)}" for k, v in stack.items())]
    lines += [f"> warning: {md(w)}" for w in plan.get("warnings") or []]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """`action-outputs RESULT CODE` (GitHub Action) and `plan-summary PLAN` (example workflows)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 3 and args[0] == "action-outputs":
        outputs = action_outputs(read_result(args[1]), int(args[2]))
        target = os.environ.get("GITHUB_OUTPUT")
        if target:
            write_github_outputs(outputs, target)
        print(" ".join(f"{k}={v}" for k, v in outputs.items()), file=sys.stderr)
        return 0
    if len(args) == 2 and args[0] == "plan-summary":
        print(plan_markdown(read_result(args[1])))
        return 0
    print(
        "usage: python -m gpucloud.ui.ci action-outputs RESULT.json EXIT_CODE\n"
        "       python -m gpucloud.ui.ci plan-summary PLAN.json",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
