"""A role assignment condition checker for Blob data actions, stricter than Azure.

It reads the condition format 2.0 ("Azure role assignment condition format and syntax",
https://learn.microsoft.com/azure/role-based-access-control/conditions-format) as far as gpucloud
writes it, and refuses what it cannot read:
- expressions of `ActionMatches{'<action>'}`, `!(...)`, parentheses, `AND`, `OR`, and the one
  attribute `@Resource[Microsoft.Storage/storageAccounts/blobServices/containers/blobs:path]`
  compared with `StringEquals`, `StringStartsWith` or `StringLike` (`*` any run of characters) to a
  quoted string;
- `AND` and `OR` mixed at one level without parentheses is a syntax error here (Azure gives AND the
  higher precedence; gpucloud never leans on it);
- any other token, attribute or operator is a syntax error, and a condition with a syntax error
  denies everything (Azure refuses to save it).
The data action of a Blob request: GET/HEAD read, PUT write (Put Blob, blocks), PUT ?comp=appendblock
add/action, DELETE delete; any other request (a container, a listing) has none and is denied.
"""

from __future__ import annotations

import fnmatch
import re

BLOB = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs"
PATH_ATTR = f"@Resource[{BLOB}:path]"
_TOKEN = re.compile(
    r"\s*(?:(?P<lp>\()|(?P<rp>\))|(?P<not>!)|(?P<op>AND|OR)\b|"
    r"ActionMatches\{'(?P<action>[^']*)'\}|"
    r"(?P<attr>@\w+\[[^\]]*\])\s+(?P<cmp>StringEquals|StringStartsWith|StringLike)\s+'(?P<value>[^']*)')"
)


class ConditionError(ValueError):
    """The condition is not one this checker can read: it denies everything."""


def data_action(method: str, query: str) -> str | None:
    if method in ("GET", "HEAD"):
        return f"{BLOB}/read"
    if method == "PUT":
        return f"{BLOB}/add/action" if "comp=appendblock" in query else f"{BLOB}/write"
    if method == "DELETE":
        return f"{BLOB}/delete"
    return None


def _tokens(text: str) -> list[tuple[str, str, str]]:
    out, pos = [], 0
    while pos < len(text):
        if not text[pos:].strip():
            break
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ConditionError(f"cannot read the condition at {text[pos : pos + 40]!r}")
        pos = m.end()
        if m["action"] is not None:
            out.append(("action", m["action"], ""))
        elif m["attr"] is not None:
            if m["attr"] != PATH_ATTR:
                raise ConditionError(f"unknown attribute {m['attr']}")
            out.append(("cmp", m["cmp"], m["value"]))
        else:
            kind = next(k for k in ("lp", "rp", "not", "op") if m[k] is not None)
            out.append((kind, m[kind], ""))
    return out


class _Parser:
    def __init__(self, tokens: list[tuple[str, str, str]], action: str, path: str) -> None:
        self.toks, self.i, self.action, self.path = tokens, 0, action, path

    def peek(self) -> tuple[str, str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, kind: str) -> tuple[str, str, str]:
        tok = self.peek()
        if tok is None or tok[0] != kind:
            raise ConditionError(f"expected {kind}, found {tok}")
        self.i += 1
        return tok

    def expr(self) -> bool:
        values = [self.unary()]
        ops: set[str] = set()
        while (tok := self.peek()) is not None and tok[0] == "op":
            self.i += 1
            ops.add(tok[1])
            values.append(self.unary())
        if len(ops) > 1:
            raise ConditionError("AND and OR mixed without parentheses")
        return all(values) if ops == {"AND"} else any(values) if ops else values[0]

    def unary(self) -> bool:
        tok = self.peek()
        if tok is None:
            raise ConditionError("the condition ends too early")
        if tok[0] == "not":
            self.i += 1
            return not self.unary()
        if tok[0] == "lp":
            self.i += 1
            value = self.expr()
            self.take("rp")
            return value
        if tok[0] == "action":
            self.i += 1
            return fnmatch.fnmatchcase(self.action.lower(), tok[1].lower())
        if tok[0] == "cmp":
            self.i += 1
            return _compare(tok[1], self.path, tok[2])
        raise ConditionError(f"unexpected {tok}")


def _compare(op: str, path: str, value: str) -> bool:
    if op == "StringEquals":
        return path == value
    if op == "StringStartsWith":
        return path.startswith(value)
    return re.fullmatch(".*".join(re.escape(p) for p in value.split("*")), path, re.S) is not None


def check(condition: str) -> None:
    """Raise ConditionError unless the condition parses (what ARM's PUT checks)."""
    allows(condition, f"{BLOB}/read", "")


def allows(condition: str, action: str, path: str) -> bool:
    """Whether the condition admits `action` on the blob at `path` (container-relative)."""
    parser = _Parser(_tokens(condition), action, path)
    value = parser.expr()
    if parser.peek() is not None:
        raise ConditionError(f"unexpected {parser.peek()} after the condition")
    return value
