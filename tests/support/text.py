"""Comparing what the CLI printed with what a test expects, whatever the output width: messages
wrap to 80 columns (or COLUMNS), so a phrase may be split over lines and indented."""

from __future__ import annotations


def flat(text: str) -> str:
    """The text with every run of whitespace (line breaks and wrap indents included) as one space."""
    return " ".join(text.split())


def messages(text: str) -> list[str]:
    """The messages of a stderr, each flattened: a line that starts at column 0 with the lines
    indented under it (its wrapped continuation, its items)."""
    out: list[str] = []
    for line in text.splitlines():
        if out and line[:1].isspace():
            out[-1] += " " + line.strip()
        else:
            out.append(line.strip())
    return [flat(m) for m in out if m]
