"""Commands that matter most when a team shares one state store (GPUCLOUD_STATE=postgresql://...):
`ls` (one's own runs, `--all` everyone's) and `budget ...`.

Registered by cli/app.py behind its error handler, as cli/setup.py's commands are; each command
imports what does the work inside its body, so `gpucloud --help` stays as it was."""

from __future__ import annotations

from typing import Annotated

import typer

from gpucloud.cli.options import JsonOpt

team_app = typer.Typer()


@team_app.command("ls")
def list_runs(
    json_out: JsonOpt = False,
    all_users: Annotated[
        bool, typer.Option("--all", help="Every user's runs (a shared store lists your own by default).")
    ] = False,
) -> None:
    """List runs."""
    from gpucloud.run.commands import show_status

    show_status(None, json_out=json_out, all_users=all_users)
