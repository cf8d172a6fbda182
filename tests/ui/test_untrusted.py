"""Untrusted text is printed without escapes, control characters or GitHub workflow commands."""

from __future__ import annotations

import io

import pytest

from gpucloud.prose import fill
from gpucloud.ui.ci import LogFence
from gpucloud.ui.progress import Progress
from gpucloud.ui.untrusted import QUOTE, shown, shown_lines, shown_stream


def test_escape_sequences_and_controls_become_visible() -> None:
    out = shown("ok\x1b]0;owned\x07\x1b[2Jdone\r\n\x9b\u202e")
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out and "\n" not in out
    assert "\u202e" not in out and "\x9b" not in out
    assert out.startswith("ok\\x1b]0;owned\\x07\\x1b[2Jdone\\x0d\\x0a")


def test_workflow_commands_are_quoted() -> None:
    assert shown("  ::add-mask::x") == f"  {QUOTE}::add-mask::x"
    assert "##[" not in shown("text ##[set-env name=A;]b")
    block = shown_lines("fine\n::stop-commands::tok\n\t::error::x")
    assert all(not line.lstrip().startswith("::") for line in block.split("\n"))


def test_long_text_is_cut_and_counted() -> None:
    out = shown("a" * 5000, limit=100)
    assert out.startswith("a" * 100) and out.endswith("(4900 more characters)")


def test_tabs_and_plain_text_unchanged() -> None:
    assert shown("epoch 1\tloss 0.25 – ü") == "epoch 1\tloss 0.25 – ü"


def test_a_stream_piece_keeps_newlines_and_tabs_only() -> None:
    assert shown_stream("a\tb\n\x1b]0;t\x07\x9bc") == "a\tb\n\\x1b]0;t\\x07\\x9bc"


def test_a_wrapped_line_never_starts_with_a_workflow_command() -> None:
    """A fenced message still holds `::` after a blank; wrapping must not move it to a line start."""
    text = "run r: failed (exit 1): " + "word " * 30 + "::error::pwned " + "more " * 20 + "\t::add-mask::x"
    for width in range(20, 90):
        assert all(not line.lstrip().startswith("::") for line in fill(shown(text), width).split("\n"))


def test_ci_log_fence_shows_escapes_and_ends_lines_at_cr() -> None:
    out = io.BytesIO()
    fence = LogFence(out, {"GITHUB_ACTIONS": "true"})
    for piece in (b"a\x1b]0;own\x07 ok\r", b"\n::stop-commands::x\n::x::\n", b"\xc3", b"\xbc\x1b[2J\r50%\r100%\n"):
        fence.write(piece)
    fence.close()
    lines = out.getvalue().decode().split("\n")
    token = lines[0].removeprefix("::stop-commands::")
    assert len(token) == 32 and lines[-2] == f"::{token}::"
    assert lines[1:-2] == ["a\\x1b]0;own\\x07 ok", "::stop-commands::x", "::x::", "ü\\x1b[2J", "50%", "100%"]
    gitlab = io.BytesIO()
    LogFence(gitlab, {"GITLAB_CI": "true"}).write(b"\x1b[0Ksection_start:1:fake\r\n")
    assert gitlab.getvalue() == b"\\x1b[0Ksection_start:1:fake\n"
    plain = io.BytesIO()
    LogFence(plain, {}).write(b"\x1b[31mred\r\n")  # outside CI the job's bytes pass untouched
    assert plain.getvalue() == b"\x1b[31mred\r\n"


def test_progress_lines_and_warnings_are_fenced(capsys: pytest.CaptureFixture[str]) -> None:
    """What a machine wrote reaches Progress (stage names, refused members): it prints it fenced."""
    progress = Progress(plain=True)
    progress.warn("member 'x\x1b]0;t\x07\n::error::y ##[z' not extracted")
    progress.info("stage \x1b[2J\u202e\n  ::add-mask::k")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\u202e" not in err and "##[" not in err
    assert not [line for line in err.split("\n") if line.lstrip().startswith("::")], err
