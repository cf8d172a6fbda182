"""The `gpucloud` command line (typer). Thin: every command imports the module that does the work
inside its body, so `gpucloud --help` stays fast and never imports boto3 or azure."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from gpucloud import __version__
from gpucloud.cli.kept import KeepOpt, OnOpt, kept_app, run_on, with_keep
from gpucloud.cli.options import (
    AgentConfigOpt,
    AllowInputOpt,
    AllowSecretOpt,
    AllReasonsOpt,
    CloudOpt,
    DetachOpt,
    EnvOpt,
    EstimatesOpt,
    FrameworkOpt,
    HostOpt,
    JsonOpt,
    PlotOpt,
    RegionOpt,
    SecretFileOpt,
    SecretOpt,
    SpecArg,
    StrictOpt,
    YesOpt,
    allowances,
)
from gpucloud.contract import registry as providers

app = typer.Typer(
    name="gpucloud",
    help="Run a declarative GPU training job on a cloud (AWS, Azure), your own machines over SSH, a Slurm "
    "cluster or this machine, then tear everything down.",
    no_args_is_help=True,
    add_completion=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

F = TypeVar("F", bound=Callable[..., Any])


def err(message: str) -> None:
    """Human messages go to stderr, wrapped to its width; stdout is for results and --json documents."""
    from gpucloud.prose import to_stderr

    to_stderr(message)


def emit_json(doc: object) -> None:
    from gpucloud.ui.jsonout import emit

    emit(doc)


def non_interactive() -> bool:
    """CI=true or no TTY: no prompts (as if --yes), no spinners, plain progress lines."""
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"} or not sys.stdin.isatty()


def handles_errors(fn: F) -> F:
    """Every failure as one clear paragraph on stderr and its exit code (docs/INTERNALS.md "Errors and exit
    codes"), CI annotations, with --json one error document on stdout; a closed stdout ends quietly (141)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from gpucloud.errors import GpucloudError
        from gpucloud.ui import jsonout

        json_out = bool(kwargs.get("json_out"))

        def fail(exc: BaseException, code: int, text: str) -> typer.Exit:
            err(text)
            if json_out:
                try:
                    jsonout.emit(
                        jsonout.error_document(exc, code)
                        if not isinstance(exc, KeyboardInterrupt)
                        else jsonout.simple_error(130, "interrupted", "interrupted")
                    )
                except BrokenPipeError:
                    jsonout.quiet_broken_pipe()
            return typer.Exit(code)

        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:
            jsonout.quiet_broken_pipe()
            raise typer.Exit(jsonout.BROKEN_PIPE_EXIT) from None
        except GpucloudError as exc:
            from gpucloud.ui import ci as ci_output

            ci_output.report_error(exc, fn.__name__)  # CI hook: annotations, step summary, dotenv (docs/CI.md)
            raise fail(exc, exc.exit_code, f"error: {exc.render()}") from None
        except KeyboardInterrupt as exc:
            raise fail(exc, 130, "interrupted") from None
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except Exception as exc:  # a bug: say so in one line, keep the traceback for GPUCLOUD_DEBUG
            from gpucloud.state.guard import no_space

            if (full := no_space(exc)) is not None:  # a full disk is not a bug: exit 74, where to free space
                raise fail(full, full.exit_code, f"error: {full.render()}") from None
            if os.environ.get("GPUCLOUD_DEBUG"):
                raise
            why = f"{type(exc).__name__}: {exc} (GPUCLOUD_DEBUG=1 shows the traceback; please report it)"
            raise fail(exc, 70, f"internal error: {why}") from None

    return wrapper  # type: ignore[return-value]


def parse_cloud(cloud: str | None) -> str | None:
    from gpucloud.errors import UserError

    if cloud is not None and cloud not in providers.names():
        raise UserError(
            f"--cloud {cloud!r} is not a cloud gpucloud knows.", hint=f"Use one of: {', '.join(providers.names())}."
        )
    return cloud


def load_job(spec: str, cloud: str | None, hosts: list[str] | None, allow: Any = None) -> tuple[Any, str | None]:
    """The job file with `--cloud`/`--host` applied before validation (a job without `gpu:` is fine with
    `--cloud local`); `--host H` (repeatable) runs it on those machines through the registry's `takes_hosts`
    provider, whatever the file says. `allow`: what the caller lets the file reach."""
    from gpucloud.errors import UserError
    from gpucloud.spec.load import Resources, load_spec

    cloud = parse_cloud(cloud)
    if not hosts:
        return load_spec(spec, resources={"cloud": cloud} if cloud else None, allow=allow), cloud
    host_cloud = cloud if cloud in providers.host_clouds() else providers.host_clouds()[0]
    if cloud not in (None, host_cloud):
        raise UserError(
            f"--host runs on your own machines; it cannot be combined with --cloud {cloud}.",
            hint=f"Drop --cloud, or drop --host (or use --cloud {host_cloud}).",
        )
    try:
        checked = Resources.model_validate({"cloud": host_cloud, "hosts": hosts})
    except Exception as exc:  # pydantic's ValidationError: say which --host is wrong
        raise UserError(
            f"--host: {str(exc).splitlines()[-1].strip()}",
            hint="Write [user@]host[:port] or an alias from ~/.ssh/config.",
        ) from None
    return load_spec(spec, resources={"cloud": host_cloud, "hosts": checked.hosts}, allow=allow), host_cloud


@app.command()
@handles_errors
def validate(
    spec: SpecArg, json_out: JsonOpt = False, allow_secret: AllowSecretOpt = None, allow_input: AllowInputOpt = None
) -> None:
    """Check a job file and print the resolved spec."""
    from gpucloud.spec.load import load_spec
    from gpucloud.ui.upload import describe_upload

    job = load_spec(spec, allow=allowances(allow_secret, allow_input))
    upload = describe_upload(job)
    doc = job.model_dump(mode="json")
    if json_out:
        emit_json({**doc, "upload": upload.as_json()})
        return
    import yaml

    from gpucloud.prose import YAML_WIDTH

    err(f"{spec}: valid")
    err(upload.summary())
    print(yaml.safe_dump(doc, sort_keys=False, width=YAML_WIDTH).rstrip())


@app.command()
@handles_errors
def plan(
    spec: SpecArg,
    cloud: CloudOpt = None,
    region: RegionOpt = None,
    spot: Annotated[bool | None, typer.Option("--spot/--no-spot", help="Force spot or on-demand.")] = None,
    json_out: JsonOpt = False,
    show_all: Annotated[bool, typer.Option("--all", help="Every candidate and exclusion group.")] = False,
    all_reasons: AllReasonsOpt = False,
    host: HostOpt = None,
    estimates: EstimatesOpt = True,
    secret: SecretOpt = None,
    secret_file: SecretFileOpt = None,
    env: EnvOpt = None,
    allow_secret: AllowSecretOpt = None,
    allow_input: AllowInputOpt = None,
    strict: StrictOpt = False,
) -> None:
    """Ranked candidates with $/h and estimated cost, the resolved stack, and why others were excluded."""
    from gpucloud.plan.planner import make_plan
    from gpucloud.run.plan import explore, plan_document
    from gpucloud.ui import views
    from gpucloud.ui.upload import describe_upload

    job, cloud = load_job(spec, cloud, host, allowances(allow_secret, allow_input))
    job, values, data, unchecked = explore(job, secret or (), secret_file or (), env or (), strict=strict)
    upload = describe_upload(job)
    result = make_plan(job, cloud=cloud, region=region, spot=spot, estimates=estimates, secrets=values)
    result.warnings.extend(unchecked)  # what `run` checks again: warnings here, errors with --strict
    if json_out:
        emit_json(plan_document(result, upload, data))  # with credentials: each candidate's GPU quota
        return
    views.print_plan(result, show_all=show_all, all_reasons=all_reasons)
    views.note(upload.summary())
    if data and data.summary():  # none when no source could be checked from here
        views.note(data.summary())


@app.command()
@handles_errors
def render(
    spec: SpecArg,
    cloud: CloudOpt = None,
    node_rank: Annotated[int, typer.Option("--node-rank", help="Which node's user-data.")] = 0,
    host: HostOpt = None,
    agent_config: AgentConfigOpt = False,
    allow_secret: AllowSecretOpt = None,
    allow_input: AllowInputOpt = None,
) -> None:
    """Print the user-data (the shim) the VM would get, or with --agent-config the agent's job.json."""
    from gpucloud.errors import UserError
    from gpucloud.plan.planner import make_plan
    from gpucloud.vm.render import render_node

    job, cloud = load_job(spec, cloud, host, allowances(allow_secret, allow_input))
    result = make_plan(job, cloud=cloud)
    first = result.candidates[0]
    if not 0 <= node_rank < job.num_nodes:
        raise UserError(f"--node-rank {node_rank} is outside 0..{job.num_nodes - 1} (num_nodes is {job.num_nodes}).")
    out = render_node(job, result, first, caps=providers.capabilities(first.cloud), node_rank=node_rank)
    sys.stdout.write(out.job_json_pretty() if agent_config else out.user_data)


def _guarded(sub_app: typer.Typer) -> typer.Typer:
    """Put every command of a sub-app (cli_*.py) behind this module's error handler."""
    for command in sub_app.registered_commands:
        if command.callback is not None:
            command.callback = handles_errors(command.callback)
    return sub_app


def _register_images() -> None:
    """`gpucloud image ...` (cli_images.py), each command behind the same error handler."""
    from gpucloud.cli.images import image_app

    app.add_typer(_guarded(image_app), name="image")


_register_images()

catalog_app = typer.Typer(
    help="List offerings (retired ones only with --all); `catalog refresh` updates them.",
    no_args_is_help=False,
    rich_markup_mode=None,
)
app.add_typer(catalog_app, name="catalog")


@catalog_app.callback(invoke_without_command=True)
@handles_errors
def catalog(
    ctx: typer.Context,
    gpu: Annotated[str | None, typer.Option("--gpu", help="Only this GPU model.")] = None,
    cloud: CloudOpt = None,
    region: RegionOpt = None,
    show_all: Annotated[bool, typer.Option("--all", help="Include retired offerings.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """List offerings (retired ones only with --all)."""
    if ctx.invoked_subcommand is not None:
        return
    from gpucloud.ui import views
    from gpucloud.ui.catalog import offering_json

    rows = views.catalog_rows(gpu=gpu, cloud=parse_cloud(cloud), region=region, include_retired=show_all)
    if json_out:
        emit_json([offering_json(o) for o in rows])
        return
    views.print_catalog(rows)


@catalog_app.command("refresh")
@handles_errors
def catalog_refresh(
    cloud: Annotated[list[str] | None, typer.Option("--cloud", help="Only this cloud (repeatable).")] = None,
    region: Annotated[list[str] | None, typer.Option("--region", help="Only this region (repeatable).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Fetch instance types, regions and prices from the clouds' APIs into the local catalog cache."""
    from gpucloud.catalog.refresh import refresh
    from gpucloud.ui.catalog import print_refresh

    report = refresh(clouds=[parse_cloud(c) or c for c in cloud or []] or None, regions=region or None, progress=err)
    if json_out:
        emit_json(report.as_json())
        return
    print_refresh(report)


@app.command()
@handles_errors
def gpus(json_out: JsonOpt = False) -> None:
    """One row per GPU model: memory, architecture, clouds, cheapest on-demand and spot $/h and where."""
    from gpucloud.catalog import load_catalog
    from gpucloud.plan.misses import unsold_note
    from gpucloud.ui.catalog import gpu_summaries
    from gpucloud.ui.views import print_gpus

    summaries = gpu_summaries(load_catalog())
    if json_out:
        emit_json([s.as_json() for s in summaries])
        return
    print_gpus(summaries)
    if note := unsold_note(summaries):
        err(note)


@app.command()
@handles_errors
def stack(
    gpu: Annotated[str, typer.Argument(help="GPU model, e.g. K80, T4, A100-80GB.")],
    cuda: Annotated[str | None, typer.Option("--cuda", help="Check a CUDA pin.")] = None,
    driver: Annotated[str | None, typer.Option("--driver", help="Check a driver pin.")] = None,
    framework: FrameworkOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """The software stack that GPU gets, with the reason for each choice."""
    from gpucloud.ui import views

    resolved = views.stack_for(gpu, cuda=cuda, driver=driver, framework=framework)
    if json_out:
        emit_json({**resolved.as_json(), "reasons": resolved.reasons, "warnings": list(resolved.warnings)})
        return
    views.print_stack(resolved)


@app.command()
@handles_errors
def schema() -> None:
    """Print the job file's JSON Schema (for editors)."""
    from gpucloud.spec.load import json_schema

    emit_json(json_schema())


@app.command()
def version() -> None:
    """Print the version."""
    print(f"gpucloud {__version__}")


@app.command()
@handles_errors
def run(
    spec: SpecArg,
    cloud: CloudOpt = None,
    region: RegionOpt = None,
    spot: Annotated[bool | None, typer.Option("--spot/--no-spot", help="Force spot or on-demand.")] = None,
    detach: DetachOpt = False,
    yes: YesOpt = False,
    no_wait: Annotated[bool, typer.Option("--no-wait", help="Do not wait for the teardown to finish.")] = False,
    json_out: JsonOpt = False,
    host: HostOpt = None,
    secret: SecretOpt = None,
    secret_file: SecretFileOpt = None,
    env: EnvOpt = None,
    allow_secret: AllowSecretOpt = None,
    allow_input: AllowInputOpt = None,
    keep: KeepOpt = None,
    on: OnOpt = None,
) -> None:
    """Run the whole lifecycle: plan, provision, stream logs, collect artifacts, tear down."""
    from gpucloud.run.lifecycle import run_job
    from gpucloud.run.plan import looked_up
    from gpucloud.spec import secrets as spec_secrets

    job, cloud = load_job(spec, cloud, host, allowances(allow_secret, allow_input))
    job = with_keep(job, keep) if on is None else job
    job, values = spec_secrets.resolve(job, secrets=secret or (), secret_files=secret_file or (), env=env or ())
    if on is not None:  # the job's own secrets and inputs, sealed to the kept machine
        run_on(on, job, values)
    data, registry = looked_up(job, values)
    result = run_job(
        job,
        cloud=cloud,
        region=region,
        spot=spot,
        detach=detach,
        assume_yes=yes or non_interactive(),
        json_out=json_out,
        wait_teardown=not no_wait,
        secret_values=values,
        data=data,
        registry=registry,
    )
    from gpucloud.run.gpu_report import usage_of
    from gpucloud.ui import ci as ci_output

    usage = usage_of(result.run_id) if ci_output.detect() else None
    ci_output.report_run({**result.as_json(), "gpu_usage": usage})  # CI hook: step summary / dotenv (docs/CI.md)
    if json_out:
        emit_json(result.as_json())
    raise typer.Exit(result.exit_code or 0)


@app.command()
@handles_errors
def status(
    run_id: Annotated[str | None, typer.Argument(metavar="RUN", help="A run id (default: all runs).")] = None,
    json_out: JsonOpt = False,
    plot: PlotOpt = None,
) -> None:
    """Runs and their phases, cost so far; with RUN, each node's GPU use."""
    from gpucloud.run.commands import show_status

    show_status(run_id, json_out=json_out)
    if plot is not None:
        _plot_usage(run_id, plot)


def _plot_usage(run_id: str | None, path: Path) -> None:
    from gpucloud.run.plot import plot_run

    err(f"wrote {plot_run(run_id, path)}")


@app.command()
@handles_errors
def logs(
    run_id: Annotated[str, typer.Argument(metavar="RUN")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the run ends.")] = False,
) -> None:
    """The job's log, also after teardown."""
    from gpucloud.run.commands import show_logs

    raise typer.Exit(show_logs(run_id, follow=follow))


@app.command()
@handles_errors
def collect(run_id: Annotated[str, typer.Argument(metavar="RUN")], json_out: JsonOpt = False) -> None:
    """Download a finished run's log and artifacts into ./gpucloud-runs/RUN/ (detached runs, or a run
    whose `gpucloud run` died); exits with the job's exit code."""
    from gpucloud.run.collect import collect_command

    raise typer.Exit(collect_command(run_id, json_out=json_out))


@app.command()
@handles_errors
def down(run_id: Annotated[str, typer.Argument(metavar="RUN")], yes: YesOpt = False) -> None:
    """Tear one run down."""
    from gpucloud.run.commands import down_run

    down_run(run_id, assume_yes=yes or non_interactive())


@app.command()
@handles_errors
def preempt(
    run_id: Annotated[str, typer.Argument(metavar="RUN")],
    node: Annotated[int | None, typer.Option("--node", help="Only this node rank (default: every node).")] = None,
) -> None:
    """Send a (simulated) interruption notice to a running run, to test its checkpoint and resume."""
    from gpucloud.run.commands import preempt_run

    preempt_run(run_id, node=node)


@app.command()
@handles_errors
def cost(
    run_id: Annotated[str | None, typer.Argument(metavar="RUN", help="A run id (default: every run).")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Runs created on or after DATE (YYYY-MM-DD).")] = None,
    json_out: JsonOpt = False,
    plot: PlotOpt = None,
    all_users: Annotated[bool, typer.Option("--all-users", help="Every user's runs (a shared store).")] = False,
) -> None:
    """What runs cost, per attempt: where, spot or on-demand, billed time, saving against on-demand."""
    from gpucloud.run.cost import cost_report

    report = cost_report(run_id, since=since, all_users=all_users)
    if plot is not None:  # one run: its GPU use over time; else spend per day and per run
        from gpucloud.run.plot import plot_cost

        if run_id is not None:
            _plot_usage(report["runs"][0]["run_id"], plot)
        else:
            err(f"wrote {plot_cost(report, plot)}")
    if json_out:
        emit_json(report)
        return
    from gpucloud.ui.views import print_cost, say

    print_cost(report)
    for run in report["runs"]:  # `cost RUN`: what its GPUs did, and the machine that would have done
        if run.get("gpu_usage"):
            from gpucloud.run.gpu_report import usage_lines

            for line in usage_lines(run["gpu_usage"]):
                say(line)


@app.command()
@handles_errors
def gc(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list what would be deleted.")] = False,
    yes: YesOpt = False,
    cloud: CloudOpt = None,
) -> None:
    """Sweep every tagged resource whose expiry has passed, on every region; exits 78 naming each cloud it
    could not check."""
    from gpucloud.run.commands import collect_garbage

    collect_garbage(dry_run=dry_run, assume_yes=yes or non_interactive(), cloud=parse_cloud(cloud))


def _register_setup() -> None:
    """`check`, `iam-policy`, `import`, `ssh`, `dev`, `ls`, `watch`, then `hosts ...` (cli/setup, peers, session,
    team)."""
    from gpucloud.cli import peers, session, setup, team

    for sub in (setup.setup_app, peers.import_app, session.session_app, team.team_app, kept_app):
        app.registered_commands.extend(_guarded(sub).registered_commands)
    app.add_typer(_guarded(setup.hosts_app), name="hosts")
    app.add_typer(_guarded(team.budget_app), name="budget")


_register_setup()


def main() -> None:
    """Run the app; usage errors with --json also get an error document, and a closed stdout
    (`gpucloud schema | head -1`) ends quietly with 141 wherever it happens."""
    from gpucloud.cli.narrow import narrowed
    from gpucloud.ui import jsonout

    try:  # typer >= 0.16 vendors click; older releases use the click package
        from typer._click import exceptions as click
    except ImportError:
        import click  # type: ignore[no-redef]

    try:
        code = narrowed(app, sys.argv[1:])(standalone_mode=False)
    except BrokenPipeError:
        jsonout.quiet_broken_pipe()
        sys.exit(jsonout.BROKEN_PIPE_EXIT)
    except click.UsageError as exc:
        exc.show()
        if jsonout.wants_json(sys.argv[1:]):
            jsonout.emit(
                jsonout.simple_error(
                    exc.exit_code, "usage", exc.format_message(), "`gpucloud COMMAND --help` lists the options."
                )
            )
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except getattr(click, "Abort", KeyboardInterrupt):
        err("aborted")
        sys.exit(130)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        jsonout.quiet_broken_pipe()
        sys.exit(jsonout.BROKEN_PIPE_EXIT)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
