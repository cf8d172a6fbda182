"""Shared test settings: every test gets its own GPUCLOUD_HOME and runs as CI would (no prompts).
With GPUCLOUD_TEST_INSTALLED=1 (.ci/run) the run stops before any test unless gpucloud, in this
process and in a CLI subprocess started the way the tests start them, is the installed package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from tests.support.cpu_profile import pytest_runtest_protocol  # noqa: F401  (per-test CPU, when asked)
from tests.support.source_tree import SOURCE, TEST_INSTALLED

REPO = Path(__file__).resolve().parent.parent

# Tests never reach a real cloud: the public endpoints the product asks without credentials point at
# a closed local port unless a test serves its own (tests/support/fake_prices.py sets it per test).
os.environ.setdefault("GPUCLOUD_AZURE_PRICES_URL", "http://127.0.0.1:9/api/retail/prices")
WHERE = "import gpucloud, sys; sys.stdout.write(gpucloud.__file__)"


def installed_package_problems() -> list[str]:
    """Where gpucloud comes from, in-process and in a `python -c` subprocess whose cwd and PYTHONPATH
    are the tests' folder (as the CLI tests start `python -m gpucloud`), when that is not site-packages."""
    import gpucloud

    purelib = Path(sysconfig.get_paths()["purelib"]).resolve()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", WHERE], capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    found = {"this process": gpucloud.__file__ or "", "a CLI subprocess": proc.stdout or proc.stderr.strip()}
    problems = []
    for who, file in found.items():
        path = Path(file).resolve()
        if not path.is_relative_to(purelib) or path.is_relative_to(SOURCE.resolve() / "gpucloud"):
            problems.append(f"{who} imports gpucloud from {file}, not from {purelib}")
    return problems


def pytest_sessionstart(session: pytest.Session) -> None:
    if not TEST_INSTALLED or hasattr(session.config, "workerinput"):
        return
    problems = installed_package_problems()
    if problems:
        pytest.exit(
            "GPUCLOUD_TEST_INSTALLED=1, but " + "; ".join(problems) + ". Run the tests from a folder "
            "without gpucloud/ (as .ci/run does) against a non-editable install.",
            returncode=3,
        )


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path_factory.mktemp("gpucloud-home")
    monkeypatch.setenv("GPUCLOUD_HOME", str(home))
    monkeypatch.setenv("CI", "true")
    return home


@pytest.fixture
def gpucloud_home(_isolated_home: Path) -> Path:
    return _isolated_home


# Seconds each test file held a worker in a profiled run of the suite (bench/suite_profile.py --write).
SCOPE_COSTS = REPO / "tests" / "scope_costs.json"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """One worker per test file, the many-celled tests spread (tests/support/xdist_files.py)."""
    from tests.support.xdist_files import FileScheduling

    return FileScheduling(config, log)


@pytest.hookimpl(tryfirst=True)  # before a folder's own ordering (tests/guest puts its boots first)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Units of work (a file, or one SPREAD cell) go out longest first: a long file started last would
    hold the run's end while the other workers wait. Within a file the order stays as written."""
    from tests.support.xdist_files import unit_of

    costs: dict[str, float] = json.loads(SCOPE_COSTS.read_text()) if SCOPE_COSTS.exists() else {}
    default = sorted(costs.values())[len(costs) // 2] if costs else 1.0
    per_file: dict[str, int] = {}
    for item in items:
        file = item.nodeid.split("::", 1)[0]
        per_file[file] = per_file.get(file, 0) + 1

    def cost(item: pytest.Item) -> float:
        file = item.nodeid.split("::", 1)[0]
        whole = costs.get(file, default)
        return whole if unit_of(item.nodeid) == file else whole / per_file[file]

    items.sort(key=lambda item: -cost(item))
