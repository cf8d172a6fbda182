"""Prose for a reader: every warning, note and error paragraph the CLI prints on stderr is wrapped
here, to the width of the terminal it goes to (80 columns in a pipe or a CI log, COLUMNS when set),
by one function, so that a long message reads the same whichever layer printed it. Long words
(paths, URLs, commands) are never broken: a reader must be able to copy them. JSON is never wrapped
(it does not pass through here). Imports nothing of gpucloud, so that every layer may use it."""

from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap
from typing import TextIO

CONTINUATION = "  "  # a wrapped line continues under its first line, two spaces further in
VERBATIM_INDENT = "    "  # a line indented this far is a command or code: printed as it is
# PyYAML folds a plain scalar once past this column, a word later at most: a job file it prints fits
# 80 columns (a literal block, `run: |`, keeps the job's own lines as written).
YAML_WIDTH = 72
_CODE_SPAN = re.compile(r"`[^`\n]+`")
_GLUE = "\x00"  # stands for a space inside a code span while wrapping: textwrap never breaks at it
# Blanks before `::`: a wrapped line that began with them would be a GitHub workflow command (the
# runner trims leading blanks before it looks for `::`), so a line never breaks there.
_BEFORE_COMMAND = re.compile(r"[ \t]+(?=::)")


def _width(stream: TextIO) -> int:
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream: as a pipe
        tty = False
    return shutil.get_terminal_size((80, 24)).columns if tty else 80


def output_width() -> int:
    """The width for stdout: COLUMNS when set, else the terminal's on a TTY, else 80: CI logs and
    pipes get text that reads well in an 80-column viewer, wrapped rather than cut."""
    return _width(sys.stdout)


def error_width() -> int:
    """The width for stderr: COLUMNS when set, else the terminal's when stderr is one, else 80."""
    return _width(sys.stderr)


def fill(text: str, width: int, *, continuation: str | None = None) -> str:
    """Each line of `text` wrapped to `width`; a continuation keeps the line's own indent plus two
    spaces (an "  - item" line continues under its item). Words longer than the width stay whole,
    so do `code spans` (a command in backticks is copied as one), and a line indented by
    VERBATIM_INDENT or more (a command, as in Markdown) is never wrapped: a shell command split over
    two lines would not run. No wrapped line starts with `::` (a workflow command under GitHub
    Actions): blanks before `::` are not break points. `continuation` replaces the continuation
    indent (a progress line continues under its message, after the time stamp)."""
    out = []
    for line in text.splitlines() or [""]:
        indent = line[: len(line) - len(line.lstrip(" "))]
        if len(indent) >= len(VERBATIM_INDENT):
            out.append(line)
            continue
        glued = _CODE_SPAN.sub(lambda m: m[0].replace(" ", _GLUE), line)
        glued = _BEFORE_COMMAND.sub(lambda m: _GLUE * len(m[0]), glued)
        wrapped = textwrap.fill(
            glued,
            width=width,
            subsequent_indent=indent + CONTINUATION if continuation is None else continuation,
            break_long_words=False,
            break_on_hyphens=False,
        )
        out.append(wrapped.replace(_GLUE, " ") or line)
    return "\n".join(out)


def to_stderr(text: str, *, continuation: str | None = None) -> None:
    """A warning, note or error paragraph on stderr, wrapped to stderr's width, flushed."""
    print(fill(text, error_width(), continuation=continuation), file=sys.stderr, flush=True)
