"""Kept machines on the command line: `gpucloud exec RUN -- CMD`, and the `run --keep`/`--on`
helpers (docs/KEEP.md). Registered by app.py behind its error handler; each command imports the
module that does the work inside its body.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gpucloud.spec.load import JobSpec

kept_app = typer.Typer()
KeepOpt = Annotated[
    str | None,
    typer.Option("--keep", metavar="IDLE", help="Keep the machine this long idle for a next job, e.g. 30m."),
]
OnOpt = Annotated[str | None, typer.Option("--on", metavar="RUN", help="Run the job on this kept run's machine.")]


@kept_app.command("exec")
def exec_command(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="A kept run (`gpucloud ls` shows them).")],
    command: Annotated[list[str], typer.Argument(metavar="-- CMD", help="The command (one word: a shell line).")],
) -> None:
    """Run a command on a kept run's machine: its env and workdir (changed files sent), its log streamed."""
    import shlex

    from gpucloud.run.exec_job import exec_job

    line = command[0] if len(command) == 1 else shlex.join(command)
    raise typer.Exit(exec_job(run_id, command=line))


def with_keep(job: JobSpec, keep: str | None) -> JobSpec:
    """`run --keep 30m` over the job file's `keep`."""
    if keep is None:
        return job
    from gpucloud.run.keep import parse_keep

    return job.model_copy(update={"keep": parse_keep(keep, job.num_nodes)})


def run_on(run_id: str, job: JobSpec, secret_values: Mapping[str, str]) -> NoReturn:
    """`run --on RUN JOB`: the job file's job on that kept run's machine, with its own secrets and
    inputs/outputs (looked up here as `run` does; the container is the kept run's own)."""
    from gpucloud.run.exec_job import exec_job

    data = None
    if job.inputs or job.outputs:
        from gpucloud.run.data_grants import check

        data = check(job)
    raise typer.Exit(exec_job(run_id, spec=job, secret_values=secret_values, data=data))
