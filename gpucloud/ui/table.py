"""Plain-text tables for plan, catalog, gpus, stack, status/ls and cost: columns two spaces apart,
a rule of ─ under the header, cells that wrap at their words to fit the output width. Written here
rather than drawn by rich so that printing a plan imports nothing but the standard library (rich
cost those commands about 35 ms of start-up); the look is that of rich's SIMPLE_HEAD tables, which
these replaced. Text is printed as it is: brackets and colons are never markup."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SHORT_CELL = 40  # a column whose values are all at most this wide is never wrapped
GAP = "  "
_WORD = re.compile(r"\s*\S+")  # a word with the spaces before it


def text_width(text: str) -> int:
    """Terminal columns: East-Asian wide and full-width characters take two, every other one."""
    if text.isascii():
        return len(text)
    from unicodedata import east_asian_width

    return sum(2 if east_asian_width(ch) in "WF" else 1 for ch in text)


def _lines(text: str) -> list[str]:
    return text.splitlines() or [""]


def _longest_word(text: str) -> int:
    return max((text_width(word) for word in text.split()), default=0)


def _fold(word: str, width: int) -> tuple[str, str]:
    """The most of `word` that fits `width` (at least one character, so that folding ends), and the rest."""
    used = 0
    for end, ch in enumerate(word):
        used += text_width(ch)
        if used > width and end:
            return word[:end], word[end:]
    return word, ""


def wrap(text: str, width: int) -> list[str]:
    """Each line of `text` broken at spaces into lines of at most `width`; a word longer than that
    is folded (cut into pieces), never truncated: an instance name cut off with "…" is lost to the reader."""
    out: list[str] = []
    for line in _lines(text):
        if text_width(line) <= width:
            out.append(line)
            continue
        current, start = "", len(out)
        for token in _WORD.findall(line):
            if text_width(current + token) <= width:
                current += token
                continue
            if current:
                out.append(current)
            current = token.lstrip()
            while text_width(current) > width:
                piece, current = _fold(current, width)
                out.append(piece)
        if current or len(out) == start:
            out.append(current)
    return out


@dataclass
class Column:
    """A column and what fitting needs of its cells, measured once as rows are added (a plan
    with --all may have thousands): the widest line and the longest word."""

    header: str
    right: bool = False
    cells: list[str] = field(default_factory=list)
    widest: int = 0  # the widest line of the cells
    word: int = 0  # the longest word of the cells
    whole: bool = False  # never wrapped: short values (names, instance types, prices)
    width: int | None = None  # fixed: the cells fold into it (a last-resort column)

    def add(self, cell: str) -> None:
        self.cells.append(cell)
        self.widest = max(self.widest, *(text_width(line) for line in _lines(cell)))
        self.word = max(self.word, _longest_word(cell))

    def natural(self) -> int:
        """The width that shows every line unbroken."""
        if self.width is not None:
            return self.width
        return max(self.widest, *(text_width(line) for line in _lines(self.header)))

    def least(self) -> int:
        """The narrowest the column may be: whole cells, or (wrapped) its longest word."""
        if self.width is not None:
            return self.width
        return self.natural() if self.whole else max(self.word, _longest_word(self.header))


class Table:
    """Rows of text under headers; `right`: the headers of the right-justified columns (numbers)."""

    def __init__(self, *headers: str, title: str | None = None, right: tuple[str, ...] = ()) -> None:
        self.title = title
        self.columns = [Column(h, right=h in right) for h in headers]

    def add_row(self, *cells: str) -> None:
        for column, cell in zip(self.columns, cells, strict=True):
            column.add(cell)

    def least_width(self) -> int:
        """The narrowest the table can be with its whole columns whole and no word broken."""
        return sum(c.least() for c in self.columns) + len(GAP) * max(len(self.columns) - 1, 0)

    def fit(
        self,
        width: int,
        optional: tuple[str, ...] = (),
        foldable: tuple[str, ...] = (),
        last_resort: tuple[str, ...] = (),
    ) -> list[str]:
        """Keep every column of short values whole (except `foldable` ones, which wrap); drop the
        `optional` columns, in that order, while the table's least width exceeds `width`; then let
        the `last_resort` columns fold, each just enough that every other column keeps its shape.
        Returns the headers of the dropped columns (a two-line header as one line)."""
        for column in self.columns:
            column.whole = 0 < column.widest <= SHORT_CELL and column.header not in foldable
        hidden: list[str] = []
        for name in optional:
            if self.least_width() <= width:
                break
            if any(c.header == name for c in self.columns):
                self.columns = [c for c in self.columns if c.header != name]
                hidden.append(name.replace("\n", " "))
        for name in last_resort:
            excess = self.least_width() - width
            if excess <= 0:
                break
            for column in self.columns:
                if column.header == name:
                    column.whole, column.width = False, max(column.widest - excess, 8)
        return hidden

    def widths(self, width: int) -> list[int]:
        """Each column's width within `width` (or the least width, when that is more): every column
        as wide as its widest line, then the widest wrapable column narrowed by one, again and again,
        until the table fits (so long texts give way before short ones, none below its longest word)."""
        widths = [c.natural() for c in self.columns]
        least = [c.least() for c in self.columns]
        excess = sum(widths) + len(GAP) * (len(widths) - 1) - max(width, self.least_width())
        while excess > 0:
            i = max((i for i, w in enumerate(widths) if w > least[i]), key=lambda i: widths[i])
            widths[i] -= 1
            excess -= 1
        return widths

    def lines(self, width: int) -> list[str]:
        """The table as lines, trailing spaces stripped; a table wider than `width` even at its
        least width is printed that wide rather than cut."""
        if not self.columns:
            return []
        widths = self.widths(width)
        total = sum(widths) + len(GAP) * (len(widths) - 1)
        out = wrap(self.title, total) if self.title else []
        out += self._row([c.header for c in self.columns], widths, bottom=True)
        out.append("─" * total)
        for cells in zip(*(c.cells for c in self.columns), strict=True):
            out += self._row(list(cells), widths, bottom=False)
        return out

    def _row(self, cells: list[str], widths: list[int], *, bottom: bool) -> list[str]:
        """One row's lines: each cell wrapped to its column and justified; a header sits on the row's
        last line (`bottom`), like the one-line headers beside a two-line one; a body cell on its first."""
        blocks = [wrap(cell, w) for cell, w in zip(cells, widths, strict=True)]
        height = max(len(b) for b in blocks)
        rows: list[list[str]] = []
        for block, w, column in zip(blocks, widths, self.columns, strict=True):
            blank = [""] * (height - len(block))
            padded = (blank + block) if bottom else (block + blank)
            if column.right:
                rows.append([" " * max(w - text_width(line), 0) + line for line in map(str.rstrip, padded)])
            else:
                rows.append([line + " " * max(w - text_width(line), 0) for line in padded])
        return [GAP.join(parts).rstrip() for parts in zip(*rows, strict=True)]
