"""The app narrowed to the command a command line names. Typer turns the signature of every
registered command into click parameters at each start (about 10 ms for gpucloud's app), and a
command line runs one of them."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import typer


def narrowed(app: typer.Typer, argv: list[str]) -> typer.Typer:
    """`app` with only the command or group that `argv` starts with. Anything else (no command, an
    option first, a name that is no command) gets the whole app, so the group's help, completion
    and "No such command" with its suggestions stay typer's own."""
    name = argv[0] if argv else ""
    commands = [c for c in app.registered_commands if (c.name or command_name(c.callback)) == name]
    groups = [g for g in app.registered_groups if g.name == name]
    if len(commands) + len(groups) != 1:
        return app
    narrow = copy.copy(app)
    narrow.registered_commands, narrow.registered_groups = commands, groups
    if commands:  # typer makes a lone command the whole program; a callback keeps `gpucloud NAME ...`
        narrow.callback()(_no_group_options)
    return narrow


def command_name(callback: Callable[..., Any] | None) -> str:
    """The name typer gives a command registered without one: its function's, with dashes."""
    return "" if callback is None else callback.__name__.lower().replace("_", "-")


def _no_group_options() -> None:
    """The narrowed app's group callback: `gpucloud` itself takes no options but --help."""
