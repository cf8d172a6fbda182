"""`gpucloud check`, `iam-policy` and `hosts probe`: is a cloud account, or a machine of yours, ready
to run jobs, and what to fix if not.

Registered by cli.py, which puts every command behind its error handler: `check` and `iam-policy`
join the top-level commands, `hosts_app` becomes `gpucloud hosts`. Like cli.py, each command imports
the module that does the work inside its body, so `gpucloud --help` imports no cloud SDK.
"""

from __future__ import annotations

from typing import Annotated

import typer

from gpucloud.ui import jsonout

setup_app = typer.Typer()
hosts_app = typer.Typer(help="Machines you own, reached over SSH (resources.hosts).", no_args_is_help=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


@setup_app.command()
def check(
    cloud: Annotated[str | None, typer.Option("--cloud", help="One cloud (default: every cloud).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Can each cloud be used: credentials, whose, enabled regions, GPU quotas; each problem with its fix."""
    from gpucloud.run.check import check_command

    raise typer.Exit(check_command(cloud, json_out=json_out))


@setup_app.command("setup")
def setup_account(
    cloud: Annotated[str, typer.Argument(help="The cloud whose account to prepare.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Create without asking.")] = False,
    print_only: Annotated[
        bool, typer.Option("--print", help="Only print the same as commands for an administrator.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Create what runs need once in an account (the deadline role, the runner policy or role), after showing it."""
    from gpucloud.cli.account import setup_command

    raise typer.Exit(setup_command(cloud, yes=yes, dry=print_only, json_out=json_out))


@setup_app.command("iam-policy")
def iam_policy(
    cloud: Annotated[str | None, typer.Argument(help="A cloud with a policy (default: the first).")] = None,
    deadline_role: Annotated[
        bool,
        typer.Option(
            "--deadline-role",
            help=(
                "The role the cloud's scheduler uses to end a run after its deadline "
                "(name, trust and permission policy)."
            ),
        ),
    ] = False,
    part: Annotated[
        str | None,
        typer.Option(
            "--part",
            help="With --deadline-role: only `trust` or "
            "`permissions`, ready for `aws iam create-role` / `put-role-policy`.",
        ),
    ] = None,
    account: Annotated[
        str | None,
        typer.Option(
            "--account",
            help=("With --deadline-role: the AWS account id (default: the credentials' account, from STS)."),
        ),
    ] = None,
    data: Annotated[
        str | None,
        typer.Option("--data", metavar="JOB", help="Add what this job file's s3:// inputs/outputs and ECR image need."),
    ] = None,
) -> None:
    """Print the least-privilege IAM policy gpucloud needs."""
    from gpucloud.contract import registry as providers
    from gpucloud.errors import UserError

    known = providers.with_policy()
    cloud = cloud or known[0]
    if cloud not in known:
        raise UserError(f"iam-policy knows only {', '.join(map(repr, known))} for now, not {cloud!r}.")
    if deadline_role or part or account:
        jsonout.emit(providers.deadline_role_documents(cloud, account, part))
        return
    doc = providers.policy_document(cloud)
    if data and "Statement" not in doc:
        raise UserError(
            f"--data adds statements to an IAM policy; {cloud}'s role definition has none.",
            hint="docs/DATA.md says which storage roles a job's inputs and outputs need there.",
        )
    if data:
        from gpucloud.run.data_grants import policy_statements
        from gpucloud.run.pull_login import policy_statements as image_statements
        from gpucloud.spec.load import load_spec

        job = load_spec(data)
        doc["Statement"] = [*doc["Statement"], *policy_statements(job), *image_statements(job)]  # type: ignore[misc]
    jsonout.emit(doc)


@hosts_app.command("probe")
def hosts_probe(
    hosts: Annotated[list[str], typer.Argument(metavar="HOST...", help="[user@]host[:port] or ssh aliases.")],
    gpu: Annotated[str | None, typer.Option("--gpu", help="Judge the hosts for this GPU request, e.g. K40:1.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """GPUs, driver, CUDA, OS, free disk of each host, and the stack gpucloud resolves for it."""
    from gpucloud.contract import registry as providers
    from gpucloud.errors import UserError
    from gpucloud.spec.load import JobSpec

    host_cloud = providers.host_clouds()[0]
    try:
        job = JobSpec.model_validate(
            {
                "name": "probe",
                "run": "true",
                "resources": {"cloud": host_cloud, "hosts": hosts, **({"gpu": gpu} if gpu else {})},
            }
        )
    except Exception as exc:  # pydantic's ValidationError: name the bad argument
        raise UserError(
            f"hosts probe: {str(exc).splitlines()[-1].strip()}",
            hint="Hosts are [user@]host[:port] or ssh aliases; --gpu is MODEL:COUNT.",
        ) from None
    from gpucloud.plan.requests import plan_request

    asks = plan_request(job)
    probes = providers.probe_hosts(host_cloud, list(job.resources.hosts or []), asks)
    if json_out:
        jsonout.emit([p.as_json() for p in probes])
    else:
        from gpucloud.prose import fill, output_width

        print(fill("\n".join(p.render() for p in probes), output_width()))
    if any(p.problems for p in probes):  # unreachable or unfit: the machine's configuration (README, exit codes)
        raise typer.Exit(78)
