"""Console-script entry point. `gpucloud version` is answered before typer (and, through it,
pydantic) is imported: scripts and CI call it often and it should cost nothing."""

from __future__ import annotations

import os
import sys


def main() -> None:
    # Everything gpucloud writes under GPUCLOUD_HOME (state, log copies, env values) is private:
    # 0600 files in 0700 folders (docs/SECURITY.md, "Local files"). Results for the user in
    # ./gpucloud-runs get their modes explicitly (extract.py).
    os.umask(0o077)
    if sys.argv[1:] in (["version"], ["--version"]):
        from gpucloud import __version__

        try:
            print(f"gpucloud {__version__}", flush=True)
        except BrokenPipeError:  # `gpucloud version | true`: quiet, as every command (jsonout.py)
            from gpucloud.ui.jsonout import BROKEN_PIPE_EXIT, quiet_broken_pipe

            quiet_broken_pipe()
            sys.exit(BROKEN_PIPE_EXIT)
        return
    from gpucloud.child_env import skip_pydantic_plugins

    skip_pydantic_plugins()
    from gpucloud.cli.app import main as cli_main

    cli_main()
