"""The CLI builds only the command a command line names (cli/narrow.py): for every command
and group, the narrowed app answers `--help`, a missing argument and an unknown option exactly as
the whole app does, and anything that names no single command gets the whole app."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpucloud.cli.app import app
from gpucloud.cli.narrow import command_name, narrowed

NAMES = sorted(
    [c.name or command_name(c.callback) for c in app.registered_commands]
    + [g.name for g in app.registered_groups if g.name]
)


def outcome(argv: list[str], whole: bool) -> tuple[int, str]:
    target = app if whole else narrowed(app, argv)
    result = CliRunner().invoke(target, argv, prog_name="gpucloud", env={"COLUMNS": "100"})
    return result.exit_code, result.output


def test_every_command_and_group_is_found() -> None:
    assert len(NAMES) == len(set(NAMES)) > 15
    for name in NAMES:
        narrow = narrowed(app, [name, "--help"])
        assert narrow is not app, name
        assert len(narrow.registered_commands) + len(narrow.registered_groups) == 1, name


@pytest.mark.parametrize("name", NAMES)
def test_narrowed_help_and_usage_errors_are_the_whole_apps(name: str) -> None:
    for argv in ([name, "--help"], [name, "--no-such-option"]):
        assert outcome(argv, whole=False) == outcome(argv, whole=True), argv


@pytest.mark.parametrize("argv", [[], ["--help"], ["no-such-command"], ["-h"], ["pla"]])
def test_no_single_command_gets_the_whole_app(argv: list[str]) -> None:
    assert narrowed(app, argv) is app
