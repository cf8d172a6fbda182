"""The command line's shared arguments and options (typer annotations), kept apart so the command
module holds only commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpucloud.contract import registry as providers

SpecArg = Annotated[str, typer.Argument(help="Path to the job file (YAML).", metavar="SPEC")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
PlotOpt = Annotated[
    Path | None,
    typer.Option("--plot", metavar="FILE", help="Draw it into FILE (.png or .svg; needs matplotlib: gpucloud[plot])."),
]
CloudOpt = Annotated[
    str | None, typer.Option("--cloud", help=f"A provider: {', '.join(providers.names())} (overrides resources.cloud).")
]
RegionOpt = Annotated[str | None, typer.Option("--region", help="Only this region.")]
SecretOpt = Annotated[
    list[str] | None,
    typer.Option("--secret", metavar="NAME[=VALUE]", help="A secret for the job (value from this env without =VALUE)."),
]
SecretFileOpt = Annotated[
    list[str] | None, typer.Option("--secret-file", metavar="PATH", help="NAME=VALUE lines of secrets.")
]
AllowSecretOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--allow-secret",
        metavar="NAME",
        help="Let the job file name this cloud or CI credential variable in secrets: (refused otherwise).",
    ),
]
AllowInputOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--allow-input",
        metavar="PATH",
        help="Let the job file upload this local path (or one under it) from outside its folder or a "
        "credentials folder (refused otherwise).",
    ),
]
EnvOpt = Annotated[list[str] | None, typer.Option("--env", metavar="NAME=VALUE", help="Set or override an env value.")]
HostOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--host",
        metavar="HOST",
        help="Run on this machine of yours, reached over SSH ([user@]host[:port] or an ssh "
        "alias; repeat for more nodes). Picks the provider that takes hosts; overrides resources.hosts.",
    ),
]
DetachOpt = Annotated[bool, typer.Option("--detach", "-d", help="Print the run id and return; the run ends itself.")]
EstimatesOpt = Annotated[
    bool, typer.Option("--estimates/--no-estimates", help="Refuse offerings whose price is an estimate.")
]
FrameworkOpt = Annotated[
    str | None, typer.Option("--framework", help="pytorch | tensorflow | none (or name==version).")
]
AgentConfigOpt = Annotated[
    bool, typer.Option("--agent-config", help="Print the agent's job.json instead of the user-data.")
]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
StrictOpt = Annotated[
    bool, typer.Option("--strict", help="Unset secrets and buckets it cannot check are errors, not warnings (CI).")
]
AllReasonsOpt = Annotated[
    bool, typer.Option("--all-reasons", help="List each excluded offering with its full reason and sources.")
]


def allowances(secrets: list[str] | None, inputs: list[str] | None) -> Any:
    """`--allow-secret`/`--allow-input` as the spec's Allowances (spec/reach.py), imported only then."""
    from gpucloud.spec.reach import Allowances

    return Allowances.of(secrets or (), inputs or ())
