"""Every command imports only what it uses: a budget of imported modules per command, recorded here
with a margin of a few modules, and top-level packages a command must never load. A change that
pulls a heavy package into a command's start-up fails here, naming the modules it added.

Budgets count modules rather than naming gpucloud's own, and leave gpucloud's packages (a folder's
`__init__`) out of the count, so moving modules between packages does not trip them. What is
forbidden is named by top-level package: cloud SDKs everywhere; rich for every command here (it
draws only the live progress of a run; tables are plain text); pydantic for every command that
reads no job file (typer is kept below 0.29, which coerced every option value with pydantic, and
the catalog and the state store use no pydantic model); jinja2 for every command that renders no
user-data.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MARGIN = 6
# The shared state store's driver counts as an SDK: loaded only when GPUCLOUD_STATE names a server.
CLOUD_SDKS = {"boto3", "botocore", "azure", "msrest", "s3transfer", "psycopg"}
# command -> (imported-module budget measured with the shipped catalog, forbidden top-level packages);
# +1 for every command but --help: `ssh`'s command module (cli/session.py) is registered as setup's are;
# +1 again for `ls`/`budget`'s (cli/team.py); +1 for every command but --help: `exec`'s (cli/kept.py)
BUDGETS: dict[str, tuple[int, set[str]]] = {
    "--help": (160, CLOUD_SDKS | {"rich", "pydantic", "jinja2", "yaml", "sqlite3"}),
    # plan and validate read the job file: yaml and the pydantic models; plan groups its exclusions
    # and dates its prices per source (ui/plan_notes.py)
    "plan examples/t4-any-cloud.yaml": (336, CLOUD_SDKS | {"jinja2", "rich"}),
    "validate examples/t4-any-cloud.yaml": (321, CLOUD_SDKS | {"jinja2", "rich"}),
    "catalog": (199, CLOUD_SDKS | {"jinja2", "yaml", "rich", "pydantic"}),
    "gpus": (200, CLOUD_SDKS | {"jinja2", "yaml", "rich", "pydantic"}),
    "status": (194, CLOUD_SDKS | {"jinja2", "yaml", "rich", "pydantic"}),  # no runs in the test home: no table
    "ls": (194, CLOUD_SDKS | {"jinja2", "yaml", "rich", "pydantic"}),
}
# Runs the CLI in this process and, at exit whatever the exit code, writes every imported module.
PROBE = """
import atexit, json, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv = ["gpucloud", *sys.argv[2:]]
from gpucloud.cli.entry import main
main()
"""


def imported_modules(command: str, tmp_path: Path) -> list[str]:
    out = tmp_path / "modules.json"
    subprocess.run(
        [sys.executable, "-c", PROBE, str(out), *command.split()],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return list(json.loads(out.read_text()))


def counted(modules: list[str]) -> list[str]:
    """The modules a budget counts: all but gpucloud's packages (the parents of other gpucloud modules)."""
    ours = [m for m in modules if m == "gpucloud" or m.startswith("gpucloud.")]
    packages = {m for m in ours if any(o.startswith(m + ".") for o in ours)}
    return [m for m in modules if m not in packages]


@pytest.mark.parametrize("command", sorted(BUDGETS))
def test_a_command_imports_no_more_than_its_budget(command: str, tmp_path: Path) -> None:
    budget, forbidden = BUDGETS[command]
    modules = imported_modules(command, tmp_path)
    tops = {m.split(".")[0] for m in modules}
    assert not tops & forbidden, f"`gpucloud {command}` imports {sorted(tops & forbidden)}, which it must not"
    if len(counted(modules)) > budget + MARGIN:
        baseline = set(imported_modules("--help", tmp_path))
        added = sorted(m for m in modules if m not in baseline)
        pytest.fail(
            f"`gpucloud {command}` imports {len(counted(modules))} modules, over its budget of {budget} (+{MARGIN}). "
            f"Beyond `--help` it imports: {', '.join(added)}. Import what the command needs lazily, or "
            "raise the budget here with the reason."
        )
