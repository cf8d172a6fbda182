"""The plain-text tables (gpucloud/ui/table.py): whatever the cells and the width, a table fits
the width unless its least width is more, loses no character of a cell, drops its optional columns
in order and only while it must, and keeps the look of the rich tables it replaced."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucloud.ui import views
from gpucloud.ui.table import GAP, Table, text_width, wrap
from gpucloud.ui.views import _table

REPO = Path(__file__).resolve().parents[2]
HEADERS = ("GPU", "instance\ntype", "$/h", "price source", "why not")
OPTIONAL = ("price source", "$/h")
CELL = st.text(alphabet=st.sampled_from("ab xyz-_.$/≈…×─0123456789\n"), max_size=50)
ROWS = st.lists(st.lists(CELL, min_size=5, max_size=5), min_size=0, max_size=6)


def table_of(rows: list[list[str]]) -> Table:
    table = _table(*HEADERS)
    for row in rows:
        table.add_row(*row)
    return table


def ink(text: str) -> str:
    """The characters a reader sees: all but spaces and line breaks."""
    return "".join(text.split())


@settings(max_examples=200, deadline=None)
@given(rows=ROWS, width=st.integers(20, 140))
def test_a_table_fits_its_width_and_loses_no_character(rows: list[list[str]], width: int) -> None:
    table = table_of(rows)
    table.fit(width, OPTIONAL, last_resort=("why not",))
    lines = table.lines(width)
    limit = max(width, table.least_width())
    assert all(text_width(line) <= limit for line in lines), (limit, lines)
    widths = table.widths(width)
    rule = next(i for i, line in enumerate(lines) if line.startswith("─"))
    assert lines[rule] == "─" * (sum(widths) + len(GAP) * (len(widths) - 1))  # the rule spans the table
    assert all(len(line) <= len(lines[rule]) for line in lines)
    starts = [sum(widths[:i]) + len(GAP) * i for i in range(len(widths))]
    for column, start, w in zip(table.columns, starts, widths, strict=True):
        shown = "".join(line[start : start + w] for line in lines[rule + 1 :])
        assert ink(shown) == ink("".join(column.cells)), column.header  # every character, in order
        head = "".join(line[start : start + w] for line in lines[:rule])
        assert ink(head) == ink(column.header)


@settings(max_examples=200, deadline=None)
@given(rows=ROWS, width=st.integers(20, 140))
def test_optional_columns_go_in_order_and_only_while_needed(rows: list[list[str]], width: int) -> None:
    table = table_of(rows)
    hidden = table.fit(width, OPTIONAL)
    assert hidden == [name.replace("\n", " ") for name in OPTIONAL[: len(hidden)]]
    for kept in range(len(hidden)):  # each column went because the table without it did not fit
        before = table_of(rows)
        before.fit(10_000)  # marks the short columns whole, drops nothing
        before.columns = [c for c in before.columns if c.header not in OPTIONAL[:kept]]
        assert before.least_width() > width
    if len(hidden) < len(OPTIONAL):
        assert table.least_width() <= width


def test_short_values_stay_whole_and_long_texts_wrap_at_words() -> None:
    table = _table("instance type", "why excluded")
    table.add_row("Standard_NC4as_T4_v3", "on-demand $6.880/h > max_price_per_hour $3 for this job")
    table.fit(40)
    assert table.lines(40) == [
        "instance type         why excluded",
        "────────────────────────────────────────",
        "Standard_NC4as_T4_v3  on-demand $6.880/h",
        "                      >",
        "                      max_price_per_hour",
        "                      $3 for this job",
    ]


def test_headers_sit_on_the_last_line_and_numbers_are_right_justified() -> None:
    table = _table("region", "$/h\ntotal", "est. $")
    table.add_row("us-east-1", "1.052", "0.53")
    table.add_row("us-west-2", "12.5", "10.20")
    assert table.lines(80) == [
        "             $/h",
        "region     total  est. $",
        "────────────────────────",
        "us-east-1  1.052    0.53",
        "us-west-2   12.5   10.20",
    ]


def test_a_body_cell_of_several_lines_starts_on_the_rows_first_line() -> None:
    table = _table("instance type", "market", title="Candidates")
    table.add_row("g4dn.xlarge", "spot\n(estimate price)")
    assert table.lines(80) == [
        "Candidates",
        "instance type  market",
        "───────────────────────────────",
        "g4dn.xlarge    spot",
        "               (estimate price)",
    ]


def test_the_last_resort_column_folds_just_enough_and_optional_ones_go_first() -> None:
    table = Table("RUN", "PHASE", "WHERE")
    table.add_row("quickstart-20261204-102200-a1b2", "setup", "local/local")
    hidden = table.fit(30, ("PHASE",), last_resort=("RUN",))
    assert hidden == ["PHASE"]
    assert table.lines(30) == [
        "RUN                WHERE",
        "──────────────────────────────",
        "quickstart-202612  local/local",
        "04-102200-a1b2",
    ]


def test_a_word_longer_than_its_column_folds_and_is_never_cut() -> None:
    assert wrap("ab cdefghij k", 4) == ["ab", "cdef", "ghij", "k"]
    assert wrap("x", 0) == ["x"]  # folding always moves on
    assert "…" not in "".join(wrap("a" * 100, 7))


def test_markup_and_emoji_codes_are_printed_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    """rich read "[legacy]" in a cell as a style and dropped it; a plain table shows it."""
    monkeypatch.setenv("COLUMNS", "80")
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    table = _table("market", "note")
    table.add_row("spot\n[legacy]", "[bold]x[/bold] :warning:")
    views._print(table)
    assert "[legacy]" in out.getvalue() and "[bold]x[/bold] :warning:" in out.getvalue()


def test_wide_characters_take_two_columns() -> None:
    assert text_width("1 × T4 ≈ …") == 10
    assert text_width("日本") == 4
    table = Table("a", "b")
    table.add_row("日本語のテキスト " * 6, "x")
    table.fit(30)
    assert all(text_width(line) <= 30 for line in table.lines(30))


def test_a_closed_stdout_raises_broken_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI turns BrokenPipeError into a quiet exit 141 (`gpucloud plan job.yaml | head`)."""

    class Closed(io.StringIO):
        def write(self, s: str) -> int:
            raise BrokenPipeError

    monkeypatch.setattr("sys.stdout", Closed())
    table = _table("a")
    table.add_row("b")
    with pytest.raises(BrokenPipeError):
        views._print(table)


def test_printing_a_table_imports_no_rich() -> None:
    """rich cost plan, catalog, gpus, stack and ls about 35 ms of start-up for their tables."""
    code = (
        "import sys\nfrom gpucloud.ui import views\n"
        "t = views._table('a', 'GPUs')\nt.add_row('b × c', '1')\nviews._print(t)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich'))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.splitlines()[-1] == "[]", out.stdout
