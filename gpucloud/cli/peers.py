"""`gpucloud import FILE`: a SkyPilot task or a dstack task as a gpucloud job file (spec/peers/).

Registered by cli/app.py behind its error handler, as cli/setup.py's commands are; the command
imports the converter inside its body, so `gpucloud --help` stays as it was."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

import_app = typer.Typer()


@import_app.command("import")
def import_peer(
    file: Annotated[str, typer.Argument(help="A SkyPilot task YAML or a dstack .dstack.yml (type: task).")],
    out: Annotated[
        Path | None, typer.Option("--out", metavar="PATH", help="Write the job file there (a new file), not stdout.")
    ] = None,
) -> None:
    """Convert a SkyPilot task or a dstack task into a gpucloud job file, noting what did not map."""
    from gpucloud.errors import UserError
    from gpucloud.prose import to_stderr
    from gpucloud.spec.load import parse_spec
    from gpucloud.spec.peers import import_file

    source = Path(file)
    if out is not None and out.exists():
        raise UserError(f"--out {out}: the file exists.", hint="Choose a new path, or remove the file first.")
    base = (out.parent if out is not None else source.parent).resolve()
    result = import_file(source, lambda text: parse_spec(text, str(out or source), base))
    if out is not None:
        out.write_text(result.text, encoding="utf-8")
    else:
        sys.stdout.write(result.text)
    where = f"wrote {out}" if out is not None else "printed the job file"
    if result.unmapped:
        to_stderr(
            f"{file}: {result.peer}; {where}. {len(result.unmapped)} field(s) did not map, each noted in a "
            f"`# gpucloud import:` comment: {', '.join(result.unmapped)}."
        )
    else:
        to_stderr(f"{file}: {result.peer}; {where}. Every field mapped.")
