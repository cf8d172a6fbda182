"""Commands that matter most when a team shares one state store (GPUCLOUD_STATE=postgresql://...):
`ls` (one's own runs, `--all` everyone's), `watch` (one run, or `--all` as a service) and `budget ...`.

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


@team_app.command()
def watch(
    run_id: Annotated[str | None, typer.Argument(metavar="RUN")] = None,
    json_out: JsonOpt = False,
    every: Annotated[bool, typer.Option("--all", help="Every detached run, until stopped (docs/TEAMS.md).")] = False,
) -> None:
    """Follow a detached run to its end: logs, spot recovery, artifacts, teardown."""
    if every or run_id is None:
        from gpucloud.run.watch_all import watch_from_cli

        raise typer.Exit(watch_from_cli(run_id, every))
    from gpucloud.run.lifecycle import watch_job
    from gpucloud.ui.jsonout import emit

    result = watch_job(run_id, json_out=json_out)
    if json_out:
        emit(result.as_json())
    raise typer.Exit(result.exit_code or 0)  # None: detached, nothing failed


budget_app = typer.Typer(
    help="Per-user and per-team daily and monthly budgets, checked by `run` and enforced by `watch --all` "
    "(docs/TEAMS.md).",
    no_args_is_help=True,
)


@budget_app.command("set")
def budget_set(
    user: Annotated[str | None, typer.Option("--user", help="The user the budget is for.")] = None,
    team: Annotated[str | None, typer.Option("--team", help="The team the budget is for.")] = None,
    daily: Annotated[float | None, typer.Option("--daily", help="$ per UTC day (0 removes it).", min=0)] = None,
    monthly: Annotated[float | None, typer.Option("--monthly", help="$ per UTC month (0 removes it).", min=0)] = None,
    add: Annotated[str | None, typer.Option("--add", help="Users to add to --team, comma-separated.")] = None,
    remove: Annotated[str | None, typer.Option("--remove", help="Users to take out of --team.")] = None,
) -> None:
    """Set a user's or a team's budgets, and who is in a team."""
    from gpucloud.errors import UserError
    from gpucloud.run import budgets
    from gpucloud.state.runs_db import Store

    if (user is None) == (team is None):
        raise UserError(
            "`budget set` needs exactly one of --user NAME or --team NAME.", hint="e.g. --user ana --daily 50"
        )
    if user is not None and (add or remove):
        raise UserError("--add and --remove change a team's members: use them with --team.")
    if daily is None and monthly is None and not (add or remove):
        raise UserError("Nothing to set.", hint="Give --daily and/or --monthly (dollars), or --add/--remove members.")
    store = Store()
    scope, name = ("user", user) if user is not None else ("team", team)
    assert name is not None
    for period, amount in (("daily", daily), ("monthly", monthly)):
        if amount is not None:
            budgets.set_budget(store, scope, name, period, amount)
    if team is not None and (add or remove):
        names = lambda text: [n.strip() for n in (text or "").split(",") if n.strip()]  # noqa: E731
        budgets.set_members(store, team, names(add), names(remove))
    _show(store, json_out=False)


@budget_app.command("ls")
def budget_ls(json_out: JsonOpt = False) -> None:
    """Every budget with what was spent against it this period."""
    from gpucloud.state.runs_db import Store

    _show(Store(), json_out=json_out)


def _show(store: object, *, json_out: bool) -> None:
    from gpucloud.run import budgets
    from gpucloud.ui import jsonout
    from gpucloud.ui.views import print_budgets

    state = budgets.status(store)  # type: ignore[arg-type]
    if json_out:
        print(jsonout.dumps({"budgets": state}))
        return
    if not state:
        from gpucloud.prose import to_stderr

        to_stderr("no budgets (`gpucloud budget set --user NAME --daily 50` sets one)")
        return
    print_budgets(state)
