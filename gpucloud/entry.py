"""Console-script entry point. `gpucloud version` is answered before typer (and, through it,
pydantic) is imported: scripts and CI call it often and it should cost nothing."""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:] in (["version"], ["--version"]):
        from gpucloud import __version__

        print(f"gpucloud {__version__}")
        return
    from gpucloud.cli import main as cli_main

    cli_main()
