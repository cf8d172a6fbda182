"""Comparing what the CLI printed with what a test expects, whatever the output width: messages
wrap to 80 columns (or COLUMNS), so a phrase may be split over lines and indented."""

from __future__ import annotations

WIDTH = 80  # the terminal width the CLI tests set (COLUMNS)


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


def too_wide(text: str) -> list[str]:
    """Lines over WIDTH, except prose lines that are one unbreakable word (a path, a URL)."""
    return [
        line
        for line in text.splitlines()
        if len(line) > WIDTH and not any(len(word) > WIDTH // 2 for word in line.split())
    ]


def header(stdout: str, first: str) -> str:
    """The table's header (its lines above the rule), flattened: headers may wrap onto two lines."""
    lines = stdout.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("─"))
    top = next(i for i in range(rule, -1, -1) if lines[i].split()[:1] == [first] or i == 0)
    start = top - 1 if top and lines[top - 1].startswith(" ") else top
    return " ".join(" ".join(lines[start:rule]).split())


def yaml_lines(text: str) -> str:
    """A YAML document less the lines of its literal blocks (`key: |` and what is indented under it)."""
    kept, block = [], -1
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        if block >= 0 and (indent > block or not line.strip()):
            continue
        block = indent if line.rstrip().endswith(("|", "|-", "|+")) and not line.lstrip().startswith("#") else -1
        kept.append(line)
    return "\n".join(kept)
