"""`gpucloud ssh` and `gpucloud dev`: a way into a running node, and a machine to develop on.

Registered by app.py behind its error handler, as cli/setup.py's commands are; the work is done
by gpucloud/run/session.py, imported inside each command so `--help` imports nothing heavy.
"""

from __future__ import annotations

from typing import Annotated

import typer

session_app = typer.Typer(rich_markup_mode=None)


@session_app.command()
def ssh(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run (its id or a unique prefix).")],
    command: Annotated[
        list[str] | None, typer.Argument(metavar="[-- CMD...]", help="One command to run instead of a shell.")
    ] = None,
    node: Annotated[int, typer.Option("--node", help="The node (rank) of a multi-node run.")] = 0,
    forward: Annotated[
        list[str] | None,
        typer.Option("-L", "--forward", metavar="[LOCAL:]PORT", help="Forward the node's PORT to 127.0.0.1 here."),
    ] = None,
    forward_only: Annotated[
        bool, typer.Option("-N", "--forward-only", help="Hold the forwards open, run nothing (Ctrl-C ends it).")
    ] = False,
    print_config: Annotated[
        bool, typer.Option("--print-config", help="Print the ssh_config entries gpucloud-RUN and gpucloud-RUN-N.")
    ] = False,
    write_config: Annotated[
        bool,
        typer.Option(
            "--write-config", help="Write those entries under GPUCLOUD_HOME and Include them from ~/.ssh/config."
        ),
    ] = False,
) -> None:
    """A shell (or one command) on a running node, reached without opening a port to the world;
    the job's `ports` and each -L are forwarded to this machine's loopback, with their URLs.
    Exits with the command's exit code (255: ssh could not connect)."""
    from gpucloud.run.session import SessionRequest, open_session

    code = open_session(
        SessionRequest(
            run_ref=run_id,
            node=node,
            command=tuple(command or ()),
            forwards=tuple(forward or ()),
            forward_only=forward_only,
            print_config=print_config,
            write_config=write_config,
        )
    )
    raise typer.Exit(code)


@session_app.command()
def dev(
    spec: Annotated[str, typer.Argument(metavar="JOB", help="The job file whose machine, stack and workdir to use.")],
    idle: Annotated[str, typer.Option("--idle", help="End the machine after this long idle, e.g. 30m.")] = "30m",
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before launching.")] = False,
) -> None:
    """A development machine: the job's machine, stack, workdir, inputs and setup, kept until idle;
    writes the ssh entry gpucloud-RUN and prints how to open it in an editor."""
    import sys

    from gpucloud.run.dev import start_dev

    raise typer.Exit(start_dev(spec, idle=idle, assume_yes=yes or not sys.stdin.isatty()))
