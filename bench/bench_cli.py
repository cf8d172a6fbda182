"""CLI start-up and planning on the shipped catalog: `--help`, `version`, `plan` of two examples, each
paired with `python -c pass` in the same run (bench/paired.py: bytecode compiled first, A B A B,
min/median/max, ratio of medians, load average), plus the count of cloud-SDK modules `--help` and
`version` import (0 expected), and two floors paired the same way: a one-command typer app with one
option (typer 0.29 imports pydantic to coerce option values) and pydantic with one model validated,
the start-up that any `gpucloud` command with options pays before its own code.

Run: python bench/bench_cli.py [--runs 9]   (from the repo root; gpucloud installed, or this tree)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired import NEUTRAL_CWD, REPO, compile_package, gpucloud_cmd, load_text, run_paired  # noqa: E402

ROWS = (
    ("gpucloud --help", ("--help",), 0.15),
    ("gpucloud version", ("version",), 0.10),
    ("gpucloud plan examples/t4-any-cloud.yaml", ("plan", str(REPO / "examples/t4-any-cloud.yaml")), 0.30),
    ("gpucloud plan --json examples/a100-azure.yaml", ("plan", "--json", str(REPO / "examples/a100-azure.yaml")), 0.30),
)


# The floor under any command with options, whatever gpucloud does: typer (0.29 coerces every option
# value with a pydantic TypeAdapter, so it imports pydantic) running a one-command app with one
# string option; and pydantic itself, imported with one model validated (what a job file needs).
FLOOR_APP = """import typer
app = typer.Typer()
@app.command()
def plan(spec: str, cloud: str | None = None) -> None:
    print(spec, cloud)
@app.command()
def other() -> None:
    pass
app()
"""
FLOOR_PYDANTIC = """from pydantic import BaseModel, Field
class Job(BaseModel):
    name: str = Field(min_length=1)
Job(name="x")
"""


def floor_rows() -> list[tuple[str, list[str]]]:
    app = NEUTRAL_CWD / "floor_typer_app.py"
    app.write_text(FLOOR_APP)
    return [
        ("floor: a typer app, one command, one option", [sys.executable, str(app), "plan", "x"]),
        ("floor: import pydantic, validate one model", [sys.executable, "-c", FLOOR_PYDANTIC]),
    ]


def sdk_modules_imported(args: list[str]) -> list[str]:
    code = (
        "import sys; sys.argv = ['gpucloud', *sys.argv[1:]]\n"
        "from gpucloud.cli.entry import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'boto3', 'botocore', 'azure'})\n"
        "print(','.join(bad), file=sys.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=NEUTRAL_CWD, capture_output=True, text=True)
    last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ""
    return [m for m in last.split(",") if m]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    compile_package()
    print(f"runs={args.runs}; {load_text()}")
    for label, argv, target in ROWS:
        print(run_paired(label, gpucloud_cmd(*argv), args.runs).line(target) + f"  [{load_text()}]")
    for label, cmd in floor_rows():
        print(run_paired(label, cmd, args.runs).line() + f"  [{load_text()}]")
    for argv in (["--help"], ["version"]):
        print(f"cloud SDK modules imported by `gpucloud {' '.join(argv)}`: {len(sdk_modules_imported(argv))}")


if __name__ == "__main__":
    main()
