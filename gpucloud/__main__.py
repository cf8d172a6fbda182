"""`python -m gpucloud` runs the CLI (used by tests that need a real subprocess)."""

from gpucloud.cli.entry import main

main()
