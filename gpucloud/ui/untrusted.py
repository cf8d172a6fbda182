"""Text that a machine, a job or an archive wrote, made safe to print.

Why: a node's status message, stage names, archive member names and log lines are written by
whoever controls the machine (or, for unsigned objects, by anyone who can read its user-data). On a
terminal an escape sequence can rewrite what the user sees (move the cursor, retitle the window,
hide a line); under GitHub Actions a line that starts with `::` (after blanks) is a workflow command
(`::add-mask::`, `::stop-commands::`, `::error::`) and `##[` starts the legacy form anywhere in a line.
Every string from outside passes through `shown()` (one line) or `shown_lines()` (a block) before the
CLI prints it: escapes and control characters become visible `\\xNN` text, and a would-be command is
quoted so that the runner does not read it. Imports nothing of gpucloud, so that every layer may use
it (docs/SECURITY.md, "What a machine says").
"""

from __future__ import annotations

import re

# C0 controls but tab, DEL, C1 controls, and the bidi overrides/isolates that reorder what is shown.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")
_COMMAND_START = re.compile(r"^(\s*)::", re.MULTILINE)
_LEGACY_COMMAND = "##["
QUOTE = "> "  # what a would-be workflow command is prefixed with: shown, never run
MAX_SHOWN = 4096  # characters of one untrusted string the CLI prints; the rest is counted, not shown


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _defuse(text: str) -> str:
    text = _COMMAND_START.sub(lambda m: f"{m.group(1)}{QUOTE}::", text)
    return text.replace(_LEGACY_COMMAND, "#\\x23[")


def shown(text: object, *, limit: int = MAX_SHOWN) -> str:
    """One line of untrusted text as it may be printed: newlines and every other control character as
    `\\xNN`, a leading `::` quoted, `##[` broken, and at most `limit` characters (the rest counted)."""
    raw = text if isinstance(text, str) else str(text)
    cut = ""
    if len(raw) > limit:
        cut = f"... ({len(raw) - limit} more characters)"
        raw = raw[:limit]
    return _defuse(_CONTROL.sub(_visible, raw)) + cut


def shown_lines(text: str, *, limit: int = MAX_SHOWN * 16) -> str:
    """A block of untrusted text (a log excerpt, a message of several lines): each line as `shown`
    makes it, the newlines kept (a CR, which can overwrite a line on a terminal, is made visible)."""
    lines = text[:limit].split("\n")
    out = "\n".join(shown(line, limit=limit) for line in lines)
    return out + (f"... ({len(text) - limit} more characters)" if len(text) > limit else "")


_STREAM_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")


def shown_stream(text: str) -> str:
    """A piece of a job's output for a CI log, as it arrives (a piece may end mid-line): every
    control character but newline and tab made visible, nothing cut. Workflow commands are left to
    the log's fence (`ui/ci.py` LogFence), which keeps the job's own lines as it wrote them."""
    return _STREAM_CONTROL.sub(_visible, text)
