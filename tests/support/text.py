"""Comparing what the CLI printed with what a test expects, whatever the output width: messages
wrap to 80 columns (or COLUMNS), so a phrase may be split over lines and indented."""

from __future__ import annotations


def flat(text: str) -> str:
    """The text with every run of whitespace (line breaks and wrap indents included) as one space."""
    return " ".join(text.split())
