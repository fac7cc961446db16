"""The one table builder of `modelforge admin`: rows that never wrap a cell.

A row is one line on the terminal, whatever its width: each cell is kept on its line and
cut with an ellipsis where the row would not fit. The columns that give way first are
those marked `flex` (free text: a hostname, labels, a failure), widest first, the less
telling ones (flex=2) before the others; those marked `optional` are left out instead
where even that would not make room; then the others but the id, down to their header's
width; a column that still does not fit is left out, from the right (all of them are in
`-o wide`, whose rows are as long as their values). Widths are decided here
rather than left to Rich, whose last resort is to fold cells over lines."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from cli.admin.cells import cell, styled
from cli.terminal import literal

M = TypeVar("M")

# Between two columns (Rich's padding of one on each side, none at the edges).
GAP: Final = 2
# A flexible column is not cut below this (or its header), while others can give way.
FLEX_FLOOR: Final = 8


@dataclass(frozen=True)
class Column(Generic[M]):
    header: str
    value: Callable[[M], object]
    # Colour the cell by its value (cells.STYLES).
    styled: bool = False
    # Free text that gives way, cut with an ellipsis: 2 before 1 (a display name before
    # the hostname), both before the rest (0).
    flex: int = 0
    # Only in `-o wide`.
    wide: bool = False
    # Left out, rather than the others cut, where the row does not fit once the flexible
    # columns gave way (a correlation id: cut, it finds nothing).
    optional: bool = False
    # What `-o wide` shows instead of value (a whole commit where the table has its start).
    full: Callable[[M], object] | None = None

    def shown(self, row: M, wide: bool) -> object:
        return self.full(row) if wide and self.full is not None else self.value(row)


def natural_width(rows: Sequence[M], columns: Sequence[Column[M]], *, wide: bool = False) -> int:
    """The width of the row that needs most, every cell whole."""
    shown = [c for c in columns if wide or not c.wide]
    widths = [
        max([cell_len(c.header), *(cell_len(cell(c.shown(row, wide), wide=wide)) for row in rows)])
        for c in shown
    ]
    return sum(widths) + GAP * max(len(widths) - 1, 0)


def render_table(
    rows: Sequence[M],
    columns: Sequence[Column[M]],
    *,
    width: int,
    wide: bool = False,
    title: str | None = None,
) -> Table:
    """rows as a table that fits `width` (ignored with wide: every column, whole)."""
    shown = [c for c in columns if wide or not c.wide]
    texts = [
        [(styled if c.styled else literal)(cell(c.shown(row, wide), wide=wide)) for c in shown]
        for row in rows
    ]
    natural = [
        max([cell_len(c.header), *(texts[i][j].cell_len for i in range(len(rows)))])
        for j, c in enumerate(shown)
    ]
    widths = natural if wide else fit(natural, shown, width)
    table = Table(
        title=literal(title) if title is not None else None,
        box=None,
        header_style="bold",
        pad_edge=False,
        expand=False,
    )
    kept = [j for j, w in enumerate(widths) if w > 0]
    for j in kept:
        table.add_column(
            shown[j].header, width=widths[j], no_wrap=True, overflow="ellipsis", min_width=1
        )
    for line in texts:
        table.add_row(*(_cut(line[j], widths[j]) for j in kept))
    return table


def fit(natural: Sequence[int], columns: Sequence[Column[M]], width: int) -> list[int]:
    """Each column's width, so the row fits `width`; 0 for a column left out."""
    widths = list(natural)
    heads = [cell_len(c.header) for c in columns]

    def excess() -> int:
        kept = [w for w in widths if w > 0]
        return sum(kept) + GAP * max(len(kept) - 1, 0) - width

    # The optional columns, from the right, where the row would not fit with every
    # flexible column at its floor: left out before anything is cut for them.
    least = [min(n, max(h, FLEX_FLOOR)) if c.flex else n
             for n, h, c in zip(natural, heads, columns, strict=True)]  # fmt: skip
    for j in reversed(range(1, len(widths))):
        kept = [w for w in least if w > 0]
        if columns[j].optional and sum(kept) + GAP * (len(kept) - 1) > width:
            widths[j] = least[j] = 0
    for level in sorted({c.flex for c in columns if c.flex}, reverse=True):
        flexible = [j for j, c in enumerate(columns) if c.flex >= level]
        floors = {j: min(natural[j], max(heads[j], FLEX_FLOOR)) for j in flexible}
        _shrink(widths, floors, excess)
    # Then the others but the first (the id), each down to its header.
    _shrink(widths, {j: min(natural[j], max(heads[j], 4)) for j in range(1, len(columns))}, excess)
    # The last resort: columns from the right left out (never the first, the id).
    for j in reversed(range(1, len(widths))):
        if excess() <= 0:
            break
        widths[j] = 0
    if excess() > 0 and widths:
        widths[0] = max(widths[0] - excess(), 1)
    return widths


def _shrink(widths: list[int], floors: dict[int, int], excess: Callable[[], int]) -> None:
    """Take from the widest of these columns first, a character at a time, each down to
    its floor at most, until nothing is in excess."""
    while excess() > 0:
        able = [j for j, floor in floors.items() if widths[j] > floor]
        if not able:
            return
        widest = max(able, key=lambda j: widths[j])
        widths[widest] -= 1


def _cut(text: Text, width: int) -> Text:
    """Cut here as Rich would, so what the table measures is what it prints."""
    if text.cell_len <= width:
        return text
    cut = text.copy()
    cut.truncate(width, overflow="ellipsis")
    return cut
