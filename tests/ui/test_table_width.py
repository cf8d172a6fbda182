"""The table fitting's own width arithmetic equals rich's measurement of the same table, at every
step of fitting (columns dropped, a column folded), for tables like the ones the CLI prints."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from gpucloud.ui.views import _table, fit_table, least_width


def rich_minimum(table: object) -> int:
    return int(Console(width=10_000).measure(table).minimum)


CELL = st.text(alphabet=st.sampled_from("ab xyz-_.$/≈…0123456789\n"), max_size=50)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.lists(CELL, min_size=5, max_size=5), min_size=0, max_size=6), width=st.integers(20, 140))
def test_least_width_is_richs_minimum_through_fitting(rows: list[list[str]], width: int) -> None:
    table = _table("GPU", "instance\ntype", "$/h", "price source", "why not")
    for row in rows:
        table.add_row(*row)
    cells: dict[int, int] = {}
    assert least_width(table, cells) == rich_minimum(table)
    fit_table(table, width, ("price source", "$/h"), last_resort=("why not",), cells=cells)
    assert least_width(table, cells) == least_width(table) == rich_minimum(table)


@pytest.mark.parametrize("markup", ["[bold]x[/bold] y", "[est] 1.23", ":warning: a"])
def test_markup_and_emoji_cells_measure_as_rich_renders_them(markup: str) -> None:
    table = _table("a", "b")
    table.add_row(markup, "plain")
    assert least_width(table) == rich_minimum(table)
