"""CLI start-up and planning on the shipped catalog: `--help`, `version`, `plan` of two examples, each
paired with `python -c pass` in the same run (bench/paired.py: bytecode compiled first, A B A B,
min/median/max, ratio of medians, load average), plus the count of cloud-SDK modules `--help` and
`version` import (0 expected), and two floors paired the same way: a typer app with one command and one
option, and the same app reading a YAML file into one pydantic model (what `plan` pays before any
of its own code).

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
    ("gpucloud gpus", ("gpus",), None),
    ("gpucloud ls", ("ls",), None),
)
# An empty GPUCLOUD_HOME: the shipped catalog and no runs, whatever this machine's own home holds.
HOME = {"GPUCLOUD_HOME": str(NEUTRAL_CWD / "home")}


# Floors, whatever gpucloud does, each paired with `python -c pass` like the commands: a typer app with
# one command and one option (what every command pays for its command line), and the same app whose
# command reads a small YAML file and validates it with one pydantic model (what `plan` and
# `validate` pay before their own code: the job file is YAML checked by pydantic models).
FLOOR_APP = """import sys
import typer
app = typer.Typer()
@app.command()
def plan(spec: str, cloud: str | None = None) -> None:
    print(spec, cloud)
@app.command()
def check(path: str) -> None:
    import yaml
    from pydantic import BaseModel, Field
    class Job(BaseModel):
        name: str = Field(min_length=1)
        run: str
    print(Job.model_validate(yaml.safe_load(open(path))))
app()
"""


def floor_rows() -> list[tuple[str, list[str]]]:
    app = NEUTRAL_CWD / "floor_typer_app.py"
    app.write_text(FLOOR_APP)
    job = NEUTRAL_CWD / "floor_job.yaml"
    job.write_text("name: floor\nrun: python train.py\n")
    return [
        ("floor: a typer app, one command, one option", [sys.executable, str(app), "plan", "x"]),
        ("floor: that app reading a YAML file into a pydantic model", [sys.executable, str(app), "check", str(job)]),
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
        print(run_paired(label, gpucloud_cmd(*argv), args.runs, HOME).line(target) + f"  [{load_text()}]")
    for label, cmd in floor_rows():
        print(run_paired(label, cmd, args.runs).line() + f"  [{load_text()}]")
    for words in (["--help"], ["version"]):
        print(f"cloud SDK modules imported by `gpucloud {' '.join(words)}`: {len(sdk_modules_imported(words))}")


if __name__ == "__main__":
    main()
