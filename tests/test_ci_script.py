"""`.ci/run` is what CI runs: it tests the installed wheel, not an editable tree, and the static
checks come before the suite and fail it on any finding. Read from the script itself, in the order
its commands run (set -e: a command that reports a finding ends the run)."""

from __future__ import annotations

import re
import tomllib

from tests.support.source_tree import SOURCE

SCRIPT = SOURCE / ".ci" / "run"


def commands() -> list[str]:
    """The script's command lines, comments and blank lines left out."""
    lines = [line.strip() for line in SCRIPT.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def position(pattern: str) -> int:
    found = [i for i, line in enumerate(commands()) if re.search(pattern, line)]
    assert len(found) == 1, (pattern, found)
    return found[0]


def test_ci_installs_the_built_wheel_never_the_tree_editable() -> None:
    assert "set -euo pipefail" in commands()
    build = position(r"python -m build\b")
    install = position(r'pip install -q "\$\{wheels\[0\]\}\[test(,postgres)?\]"')
    assert build < install
    assert not [line for line in commands() if re.search(r"pip install .*(-e\b|--editable)", line)]
    assert position(r"GPUCLOUD_TEST_INSTALLED=1") < position(r"python -m pytest")


def test_static_checks_run_before_the_suite_with_the_pinned_tools() -> None:
    suite = position(r"python -m pytest")
    for check in (r"^ruff check \.$", r"^ruff format --check \.$", r"^mypy gpucloud$"):
        assert position(check) < suite, check
    extra = tomllib.loads((SOURCE / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    pinned = {re.split(r"[=<>~!]", req)[0]: req for req in extra}
    assert pinned["ruff"].startswith("ruff==") and pinned["mypy"].startswith("mypy=="), pinned


def test_the_guest_ci_set_runs_by_default_and_its_image_builds_in_the_background() -> None:
    """The real-guest CI set is on unless the caller says otherwise; its Debian packages come in the
    one background apt transaction, and the same background job then starts the image build, before
    the Python side (wheel, venv, static checks) and the tests, which wait on the image's lock."""
    assert position(r'^export GPUCLOUD_GUEST_TESTS="\$\{GPUCLOUD_GUEST_TESTS:-ci\}"$') < position(r"python -m pytest")
    at = position(r"^tools\+=\(qemu-system-x86_64:")
    packages = " ".join(commands()[at : at + 2])  # the entry continues on the next line
    for package in ("qemu-system-x86", "debootstrap", "dpkg-dev", "apt-utils"):
        assert f":{package}" in packages, packages
    install = position(r"apt-get install")  # one transaction for every package
    build = position(r"^python3 tests/support/guest_image\.py >\"\$guest_log\" 2>&1 &$")
    assert install < build < position(r"^python3 -m venv --clear \.venv-ci$")


def test_the_guest_image_builds_with_the_system_python_alone() -> None:
    """.ci/run starts the build before any venv exists: the module imports nothing but the stdlib."""
    import ast
    import sys

    tree = ast.parse((SOURCE / "tests" / "support" / "guest_image.py").read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {name.split(".")[0] for name in names} <= set(sys.stdlib_module_names) | {"__future__"}, names
