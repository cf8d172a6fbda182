"""`gpucloud setup azure`: the custom roles `gpucloud runner` (whoever runs jobs) and `gpucloud node
channel` (each VM's identity on its run's channel blobs; node_access.py) in the subscription (rbac.py),
each read first and created or updated only when missing or different, so a second run changes nothing.

Creating a role definition needs Microsoft.Authorization/roleDefinitions/write (Owner or User
Access Administrator): an administrator runs setup once, then assigns the role, with its condition,
to the people, apps and CI identities that run jobs. Nothing per run is created here (each VM's
identity and role assignment belong to its run). `--print` gives the same as `az` commands.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from gpucloud.providers.azure.rbac import (
    NODE_ROLE_NAME,
    ROLE_NAME,
    arm_body,
    assign_command,
    node_role_definition,
    node_role_id,
    role_id,
)

ROLE_DEFINITIONS_API = "2022-04-01"


def role_path(subscription: str, role: str | None = None) -> str:
    """A role definition's ARM path: the runner role's unless `role` (a definition name) is given."""
    name = role or role_id(subscription)
    return f"/subscriptions/{subscription}/providers/Microsoft.Authorization/roleDefinitions/{name}"


def node_role_path(subscription: str) -> str:
    return role_path(subscription, node_role_id(subscription))


def roles(subscription: str) -> list[tuple[str, str, dict[str, Any], str]]:
    """(name, path, PUT body, why) of each role setup makes."""
    return [
        (ROLE_NAME, role_path(subscription), arm_body(subscription), "the least-privilege role for whoever runs jobs"),
        (
            NODE_ROLE_NAME,
            node_role_path(subscription),
            arm_body(subscription, node_role_definition(subscription)),
            "each VM's own access to its run's channel blobs (without it nodes use SAS URLs only)",
        ),
    ]


def _permissions(doc: dict[str, Any]) -> Any:
    """The part of a role definition that decides what it allows (compared as sets)."""
    props = doc.get("properties") or {}
    perms = (props.get("permissions") or [{}])[0]
    return (
        sorted(str(a).lower() for a in perms.get("actions") or []),
        sorted(str(a).lower() for a in perms.get("dataActions") or []),
        sorted(str(s).lower() for s in props.get("assignableScopes") or []),
    )


def _send(arm: Any, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    from azure.core.rest import HttpRequest

    kwargs: dict[str, Any] = {"params": {"api-version": ROLE_DEFINITIONS_API}}
    if body is not None:
        kwargs["json"] = body
    response = arm.send_request(HttpRequest(method, path, **kwargs))
    try:
        doc = dict(response.json() or {})
    except (ValueError, TypeError):
        doc = {}
    return response.status_code, doc


def _refused(status: int, doc: dict[str, Any], subscription: str) -> Exception:
    from gpucloud.errors import CloudAccessError

    found = doc.get("error")
    error: dict[str, Any] = found if isinstance(found, dict) else {}
    message = (str(error.get("message", "")).splitlines() or [""])[0]
    said = f"HTTP {status} {error.get('code', '')}: {message}"
    return CloudAccessError(
        f"Azure refused the role definition in subscription {subscription} ({said}).",
        cloud="azure",
        hint="`gpucloud setup azure` needs an administrator (Microsoft.Authorization/roleDefinitions/write: "
        "Owner or User Access Administrator); `gpucloud setup azure --print` shows the commands to hand to one.",
    )


def inspect(arm: Any, subscription: str, role: tuple[str, str, dict[str, Any], str]) -> dict[str, Any]:
    """One role's piece: {piece, state (present/missing/differs), detail}."""
    name, path, body, why = role
    piece = {"piece": f"role definition '{name}'", "kind": "custom-role", "id": path}
    status, doc = _send(arm, "GET", path)
    if status == 404:
        return {**piece, "state": "missing", "detail": why}
    if status != 200:
        raise _refused(status, doc, subscription)
    if _permissions(doc) == _permissions(body):
        return {**piece, "state": "present", "detail": path.rsplit("/", 1)[-1]}
    return {**piece, "state": "differs", "detail": "its actions will be set to this gpucloud's"}


def print_commands(subscription: str) -> list[str]:
    """The whole setup as `az` commands (`gpucloud setup azure --print`). Each role is PUT at its own
    id, as `setup` makes it (`az role definition create` would pick a random one, which neither
    `check` nor the runner's condition, naming the node role's id, would find)."""
    commands = []
    for name, path, body, _ in roles(subscription):
        file = f"{name.replace(' ', '-')}.json"
        commands += [
            f"cat > {file} <<'EOF'\n{json.dumps(body, indent=2)}\nEOF",
            f'az rest --method put --url "https://management.azure.com{path}?api-version={ROLE_DEFINITIONS_API}" '
            f"--body @{file}",
        ]
    return [*commands, assign_command(subscription)]


def setup(*, dry: bool, confirm: Callable[[list[dict[str, Any]]], bool], say: Callable[[str], None]) -> dict[str, Any]:
    """`gpucloud setup azure`: inspect, show, ask (`confirm`), create or update the role."""
    from gpucloud.providers.azure.access import no_subscription

    sub = os.environ.get("AZURE_SUBSCRIPTION_ID", "")
    if dry:
        return {"cloud": "azure", "subscription": sub, "commands": print_commands(sub or "<subscription-id>")}
    if not sub:
        raise no_subscription()
    from gpucloud.providers.azure.provider import AzureProvider

    arm = AzureProvider(subscription_id=sub).resource
    wanted = roles(sub)
    pieces = [inspect(arm, sub, role) for role in wanted]
    if any(p["state"] != "present" for p in pieces) and confirm(pieces):
        for role, piece in zip(wanted, pieces, strict=True):
            if piece["state"] == "present":
                continue
            status, doc = _send(arm, "PUT", role[1], role[2])
            if status not in (200, 201):
                raise _refused(status, doc, sub)
            say(f"{'created' if piece['state'] == 'missing' else 'updated'} {piece['piece']}")
        pieces = [inspect(arm, sub, role) for role in wanted]
    return {"cloud": "azure", "account": sub, "pieces": pieces, "attach": [assign_command(sub)]}
