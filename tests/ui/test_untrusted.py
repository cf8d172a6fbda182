"""Untrusted text is printed without escapes, control characters or GitHub workflow commands."""

from __future__ import annotations

from gpucloud.ui.untrusted import QUOTE, shown, shown_lines


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
