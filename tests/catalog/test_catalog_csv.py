"""The shipped offerings.csv reader (csv.reader, not DictReader, for speed) still names a bad header or
a row with too few or too many cells by file and line, and skips blank lines."""

from __future__ import annotations

import pytest

from gpucloud.catalog import CatalogError, validate_offerings_text
from tests.support.source_tree import package_dir

SHIPPED = package_dir() / "catalog" / "data" / "offerings.csv"  # the installed package's in CI


def _lines() -> list[str]:
    return SHIPPED.read_text(encoding="utf-8").splitlines()


def test_the_shipped_file_reads_and_a_blank_line_is_skipped() -> None:
    lines = _lines()
    rows = validate_offerings_text("\n".join(lines) + "\n")
    assert len(rows) == len(lines) - 1
    assert validate_offerings_text("\n".join([lines[0], lines[1], "", lines[2]]) + "\n") == rows[:2]


@pytest.mark.parametrize("cut", [lambda s: s.rsplit(",", 1)[0], lambda s: s + ",extra"])
def test_a_row_with_the_wrong_number_of_cells_is_named_by_line(cut: object) -> None:
    lines = _lines()
    lines[3] = cut(lines[3])  # type: ignore[operator]
    with pytest.raises(CatalogError, match=r"offerings.csv line 4: wrong number of columns"):
        validate_offerings_text("\n".join(lines) + "\n")


def test_a_wrong_header_is_named() -> None:
    lines = _lines()
    lines[0] = lines[0].replace("price_date", "date")
    with pytest.raises(CatalogError, match=r"offerings.csv line 1: header is"):
        validate_offerings_text("\n".join(lines) + "\n")
