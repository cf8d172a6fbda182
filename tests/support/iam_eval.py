"""A small IAM policy evaluator: enough of the policy language to prove what gpucloud's policy
allows and denies (tests/providers/aws/test_aws_policy.py), not a replacement for AWS's.

Supported: Allow/Deny (an explicit Deny wins, nothing matching is an implicit deny), Action and
Resource with `*`/`?` wildcards, policy variables `${aws:...}` from the request context, and the
condition operators StringEquals, StringLike, Bool, NumericEquals, Null, each also as
ForAnyValue:/ForAllValues:. Keys of one operator and operators of one statement are ANDed, values
of one key ORed; a key missing from the request fails every operator but Null (AWS's rule).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Value = str | bool | int | list[str] | None


@dataclass
class Request:
    """One IAM authorisation question: an action on one resource with its condition context."""

    action: str
    resource: str
    context: dict[str, Value] = field(default_factory=dict)


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _subst(text: str, context: Mapping[str, Value]) -> str:
    return re.sub(r"\$\{([^}]+)\}", lambda m: str(context.get(m.group(1), m.group(0))), text)


def _glob(pattern: str, value: str, *, case: bool = True) -> bool:
    if not case:
        pattern, value = pattern.lower(), value.lower()
    return re.fullmatch(".*".join(re.escape(p).replace(r"\?", ".") for p in pattern.split("*")), value) is not None


def _test(op: str, have: Any, want: str) -> bool:
    if op == "StringEquals":
        return str(have) == want
    if op == "StringLike":
        return _glob(want, str(have))
    if op == "Bool":
        return str(have).lower() == want.lower()
    if op == "NumericEquals":
        return float(have) == float(want)
    raise ValueError(f"condition operator {op} not supported by this evaluator")


def _condition_holds(operator: str, key: str, wanted: Any, context: Mapping[str, Value]) -> bool:
    qualifier, _, op = operator.rpartition(":")
    wanted_values = [_subst(str(w), context) for w in _list(wanted)]
    if op == "Null":  # "true": the key must be absent; "false": present
        return (context.get(key) is None) == (wanted_values[0].lower() == "true")
    have = context.get(key)
    if have is None:
        return qualifier == "ForAllValues"  # AWS: ForAllValues over no values is true
    values = _list(have)
    if qualifier == "ForAllValues":
        return all(any(_test(op, v, w) for w in wanted_values) for v in values)
    if qualifier == "ForAnyValue" or len(values) == 1:
        return any(_test(op, v, w) for v in values for w in wanted_values)
    raise ValueError(f"{key} has several values: use ForAnyValue/ForAllValues with {op}")


def _matches(statement: Mapping[str, Any], req: Request) -> bool:
    actions = _list(statement.get("Action", []))
    if not any(_glob(a, req.action, case=False) for a in actions):
        return False
    resources = [_subst(r, req.context) for r in _list(statement.get("Resource", "*"))]
    if not any(_glob(r, req.resource) for r in resources):
        return False
    for operator, keys in (statement.get("Condition") or {}).items():
        for key, wanted in keys.items():
            if not _condition_holds(operator, key, wanted, req.context):
                return False
    return True


def decide(policy: Mapping[str, Any], req: Request) -> str:
    """ "Allow", "Deny" (an explicit Deny matched) or "ImplicitDeny" (nothing allowed it)."""
    verdict = "ImplicitDeny"
    for statement in policy["Statement"]:
        if _matches(statement, req):
            if statement["Effect"] == "Deny":
                return "Deny"
            verdict = "Allow"
    return verdict


def allowed(policy: Mapping[str, Any], requests: Iterable[Request]) -> bool:
    """An API call is allowed only when every resource it touches is (RunInstances: several)."""
    return all(decide(policy, r) == "Allow" for r in requests)


def statements(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The policy's Allow statements."""
    return [s for s in doc["Statement"] if s["Effect"] == "Allow"]


def as_list(value: str | Iterable[str]) -> list[str]:
    """An Action or Resource field as a list (the policy language allows one string)."""
    return [value] if isinstance(value, str) else list(value)


def is_allowed(action: str, doc: dict[str, Any]) -> bool:
    """Whether some Allow statement names the action (wildcards matched, conditions not read)."""
    return any(fnmatch.fnmatchcase(action, pattern) for s in statements(doc) for pattern in as_list(s["Action"]))
