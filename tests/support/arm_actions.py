"""The Azure RBAC action of an ARM request, and whether a role's actions allow it.

ARM authorises each request by its operation, `{namespace}/{type}[/{child type}...]/{read|write|
delete}` or `.../{name}/action` for a POST (Azure resource provider operations,
https://learn.microsoft.com/azure/role-based-access-control/resource-provider-operations). The
fake ARM (fake_arm.py) asks `allowed` with the role given to the test principal; a request whose
action this module cannot name is denied (stricter than Azure, so a new kind of call cannot pass
unnoticed).
"""

from __future__ import annotations

import fnmatch
import re

_VERB = {"GET": "read", "HEAD": "read", "PUT": "write", "PATCH": "write", "DELETE": "delete"}
# Sub-resources a GET reads under their parent's read permission (ARM has no operation of their own).
_READ_AS_PARENT = {"instanceview"}


def action_of(method: str, path: str) -> str | None:
    """The action of `method path` (path without query), or None when it cannot be named."""
    parts = [p for p in path.split("/") if p]
    low = [p.lower() for p in parts]
    if len(parts) < 2 or low[0] != "subscriptions":
        return None
    if "providers" in low[2:]:
        at = len(low) - 1 - low[::-1].index("providers")
        return _provider_action(method, parts[at + 1 :])
    rest = low[2:]
    base = "Microsoft.Resources/subscriptions"
    if not rest:
        return f"{base}/read" if method in ("GET", "HEAD") else None
    if rest == ["locations"] and method == "GET":
        return f"{base}/locations/read"
    if rest[0] == "resourcegroups":
        if len(rest) <= 2:
            return f"{base}/resourceGroups/{_VERB[method]}" if method in _VERB else None
        if rest[2:] == ["resources"] and method == "GET":
            return f"{base}/resourceGroups/resources/read"
    return None


def _provider_action(method: str, parts: list[str]) -> str | None:
    """`Namespace/type/name[/child type/name...][/action or collection]` below `providers`."""
    if len(parts) < 2:
        return None
    rest = parts[1:]
    types = [parts[0], *rest[0::2]]
    if len(rest) % 2 == 0:  # a resource itself
        verb = _VERB.get(method)
        return "/".join(types) + f"/{verb}" if verb else None
    last = types.pop()  # an action (POST) or a collection (GET)
    if method == "POST" and types[1:]:
        return "/".join([*types, last]) + "/action"
    if method == "GET" and last.lower() in _READ_AS_PARENT and types[1:]:
        return "/".join(types) + "/read"
    if method == "GET":
        return "/".join([*types, last]) + "/read"
    return None


def allowed(action: str | None, actions: list[str], not_actions: list[str] | None = None) -> bool:
    """ARM's match: case-insensitive, `*` a wildcard; NotActions take away from Actions."""
    if action is None:
        return False

    def hit(patterns: list[str]) -> bool:
        return any(fnmatch.fnmatchcase(action.lower(), p.lower()) for p in patterns)

    return hit(actions) and not hit(not_actions or [])


def denied_message(principal: str, action: str | None, scope: str) -> str:
    """ARM's 403 AuthorizationFailed message, which names the action."""
    named = action or "an operation this fake cannot name"
    return (
        f"The client '{principal}' with object id '{principal}' does not have authorization to perform "
        f"action '{named}' over scope '{scope}' or the scope is invalid. If access was recently granted, "
        "please refresh your credentials."
    )


def scope_of(path: str) -> str:
    return re.sub(r"/+$", "", path)
