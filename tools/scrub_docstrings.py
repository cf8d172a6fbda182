"""Docstrings, comments and docs say why, not which issue asked for it or what the code used to do.

    python3 tools/scrub_docstrings.py          # rewrite what can be rewritten, list the rest
    python3 tools/scrub_docstrings.py --check  # list only; exit 1 when anything is listed

Rewritten: issue references in parentheses, "(issue 13, item 3)" or "(issue 11, docs/X.md)" (the
issue parts go, the rest stays), and a leading "issue 13: " in a comment. Listed for a person, with
file and line (the fix needs judgement): any other issue number, change history ("was ... now",
"no longer", "used to", "previously", "formerly"), owner tags ("(lead)"), and Python lines over 120
columns that ruff's E501 lets through (its pragma exemption: a trailing `# type: ignore[...]` or
`# noqa`). Only comments and docstrings of Python files are touched, and prose outside code blocks
of Markdown files; strings the code uses are left alone. Idempotent.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

PY_DIRS = ("gpucloud", "tests", "bench", "tools")
MD_GLOBS = ("docs/*.md", "README.md", "BENCHMARKS.md")
SELF = "tools/scrub_docstrings.py"
MAX_LINE = 120

ISSUE = r"[Ii]ssues? \d+[a-z]?"
ISSUE_PART = re.compile(
    rf"^\s*(?:{ISSUE}(?:,?\s+(?:item|point)s?\s+[\w.]+)?|(?:item|point)s?\s+[\w.]+|\"[Dd]one when\"|[Dd]one when)\s*$"
)
PAREN = re.compile(r"( ?)\(([^()\n]*)\)")
LEADING = re.compile(rf"(?<![\w(]){ISSUE}(?:,? (?:item|point) \w+)?: ")
LEFT = re.compile(rf"\b{ISSUE}\b")
HISTORY = re.compile(
    r"\b(?:was\b[^.\n]{0,60}\bnow\b|now\b[^.\n]{0,60}\bsince\b|no longer\b|used to\b|previously\b|formerly\b)",
    re.IGNORECASE,
)
OWNER = re.compile(r"\((?:lead|owner:[^)]*)\)")


def scrub(text: str, capitalize: bool = True) -> str:
    """Issue references in parentheses and a leading "issue N: ", removed from one piece of prose."""

    def paren(m: re.Match[str]) -> str:
        parts = re.split(r"[,;]", m.group(2))
        if not any(re.match(rf"^\s*{ISSUE}\b", p) for p in parts):
            return m.group(0)
        kept = [p.strip() for p in parts if not ISSUE_PART.match(p)]
        if len(kept) == len(parts):
            return m.group(0)  # "issue 11 says ..." inside a sentence: listed, not guessed at
        return f"{m.group(1)}({', '.join(kept)})" if kept else ""

    def leading(m: re.Match[str]) -> str:
        return "\0" if capitalize and re.search(r'(^|"""|# |#)$', m.string[: m.start()]) else ""

    text = PAREN.sub(paren, text)
    text = LEADING.sub(leading, text)
    # A sentence that began with the reference begins with its next word now.
    return re.sub(r"\0(\w)", lambda m: m.group(1).upper(), text).replace("\0", "")


def _python(path: Path, text: str) -> str:
    """Apply `scrub` to comments and docstrings (strings that are a statement of their own)."""
    edits: list[tuple[tuple[int, int], tuple[int, int], str]] = []
    prev = tokenize.NEWLINE
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return text
    for i, tok in enumerate(tokens):
        j = i + 1
        while j < len(tokens) and tokens[j].type == tokenize.COMMENT:
            j += 1
        after = tokens[j].type if j < len(tokens) else tokenize.ENDMARKER
        statement_string = (
            tok.type == tokenize.STRING
            and prev in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
            and after in (tokenize.NEWLINE, tokenize.ENDMARKER)
        )
        if tok.type == tokenize.COMMENT or statement_string:
            trailing = tok.type == tokenize.COMMENT and tok.line[: tok.start[1]].strip() != ""
            new = scrub(tok.string, capitalize=not trailing)
            if new != tok.string:
                edits.append((tok.start, tok.end, new))
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            prev = tok.type
    if not edits:
        return text
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    for (sl, sc), (el, ec), new in sorted(edits, reverse=True):
        a, b = offsets[sl - 1] + sc, offsets[el - 1] + ec
        text = text[:a] + new + text[b:]
    return text


def _markdown(text: str) -> str:
    """Apply `scrub` to prose, not to fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        out.append(line if fenced else scrub(line))
    return "".join(out)


def files(root: Path) -> list[Path]:
    tracked = subprocess.run(["git", "ls-files"], cwd=root, check=True, capture_output=True, text=True).stdout
    names = set(tracked.splitlines())
    found = [root / n for n in sorted(names) if n.endswith(".py") and n.split("/")[0] in PY_DIRS and n != SELF]
    for pattern in MD_GLOBS:
        found += [p for p in sorted(root.glob(pattern)) if str(p.relative_to(root)) in names]
    return found


def listed(rel: str, text: str) -> list[str]:
    """What a person must still rewrite, one line each."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        is_code_line = rel.endswith(".py") and "#" not in line and '"""' not in line
        for what, pattern in (("issue number", LEFT), ("change history", HISTORY), ("owner tag", OWNER)):
            if not is_code_line and pattern.search(line):
                out.append(f"{rel}:{n}: {what}: {line.strip()[:100]}")
        if rel.endswith(".py") and len(line) > MAX_LINE:
            out.append(f"{rel}:{n}: line of {len(line)} columns (ruff's pragma exemption): split it")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="list only, change nothing")
    parser.add_argument("--root", type=Path, default=Path.cwd())
    args = parser.parse_args()
    root = args.root.resolve()
    changed, todo = 0, []
    for path in files(root):
        rel = str(path.relative_to(root))
        text = path.read_text(encoding="utf-8")
        new = _python(path, text) if rel.endswith(".py") else _markdown(text)
        if new != text:
            changed += 1
            if not args.check:
                path.write_text(new, encoding="utf-8")
        todo += listed(rel, new if not args.check else text)
    for line in todo:
        print(line)
    verb = "would change" if args.check else "changed"
    print(f"{changed} files {verb}; {len(todo)} places listed for a person", file=sys.stderr)
    return 1 if args.check and (changed or todo) else 0


if __name__ == "__main__":
    sys.exit(main())
