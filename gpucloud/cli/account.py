"""`gpucloud setup CLOUD`: show what an account needs once, ask, create it; or print it for an
administrator (`--print`). The provider's registry entry does the cloud's part; this module is the
conversation: the list of pieces, the question (or --yes), the policy to attach afterwards.

Without a terminal and without --yes nothing is created (exit 2): roles and policies in an
account are not something a script should create because it forgot a flag.
"""

from __future__ import annotations

import sys
from typing import Any

from gpucloud.contract import registry as providers
from gpucloud.errors import UserError


def _show(pieces: list[dict[str, Any]]) -> None:
    for p in pieces:
        print(f"  {p['state']:<8} {p['piece']}: {p['detail']}", file=sys.stderr)


def setup_command(cloud: str, *, yes: bool, dry: bool, json_out: bool) -> int:
    """Run the provider's setup; returns the exit code."""
    from gpucloud.ui.jsonout import emit

    known = providers.with_setup()
    if cloud not in known:
        raise UserError(
            f"setup knows {', '.join(map(repr, known))}, not {cloud!r}.", hint=f"`gpucloud setup {known[0]}`"
        )
    refused: list[bool] = []

    def confirm(pieces: list[dict[str, Any]]) -> bool:
        todo = [p for p in pieces if p["state"] != "present"]
        print(f"gpucloud setup {cloud} will create or update {len(todo)} piece(s):", file=sys.stderr)
        _show(todo)
        if yes:
            return True
        if not sys.stdin.isatty():
            refused.append(True)
            return False
        from gpucloud.ui.views import ask

        return ask("Create them?")

    doc = providers.run_setup(
        cloud, dry=dry, confirm=confirm, say=lambda line: print(f"{cloud}: {line}", file=sys.stderr)
    )
    if json_out:
        emit(doc)
    elif dry:
        print("\n".join(doc["commands"]))
    else:
        _report(cloud, doc)
    if refused:
        raise UserError(
            f"gpucloud setup {cloud}: nothing was created (no terminal to ask).",
            hint=f"Pass --yes to create the pieces above, or `gpucloud setup {cloud} --print` for the commands.",
        )
    return 0 if all(p["state"] == "present" for p in doc.get("pieces", [])) else 1


def _report(cloud: str, doc: dict[str, Any]) -> None:
    """What is in place now, and how to give people or CI the right to run jobs."""
    pieces = doc.get("pieces", [])
    print(f"{cloud} ({doc.get('account', '')}):")
    for p in pieces:
        print(f"  {p['state']:<8} {p['piece']}  {p['detail']}")
    if doc.get("attach"):
        print("Give whoever runs jobs (people, CI roles) the runner permissions:")
        for line in doc["attach"]:
            print(f"  {line}")
