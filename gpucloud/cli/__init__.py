"""The command line: typer commands that import the module doing the work lazily."""
