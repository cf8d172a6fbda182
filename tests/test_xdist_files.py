"""The suite's own spreading over xdist workers (tests/support/xdist_files.py): a file is one unit
of work, a SPREAD cell its own; every SPREAD name is a test that exists (a rename would silently
put its many cells back on one worker)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.xdist_files import SPREAD, unit_of

TESTS = Path(__file__).resolve().parent


def test_a_file_is_one_unit_and_a_spread_cell_its_own() -> None:
    assert unit_of("tests/a/test_x.py::test_y[cell-1]") == "tests/a/test_x.py"
    assert unit_of("tests/a/test_x.py::Klass::test_y") == "tests/a/test_x.py"
    cell = "tests/a/test_x.py::test_fault_matrix_teardown[RunInstances@hang]"
    assert unit_of(cell) == cell


def test_every_spread_name_is_a_test_of_the_suite() -> None:
    defined = {
        m.group(1)
        for path in TESTS.rglob("test_*.py")
        for m in re.finditer(r"^def (test_\w+)\(", path.read_text(), re.M)
    }
    assert SPREAD <= defined, SPREAD - defined
