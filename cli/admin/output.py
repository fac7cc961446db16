"""How `modelforge admin` shows what it got: a table (coloured on a terminal, plain in a
pipe), a key/value panel for one object, or the wire model's JSON with --json, which is
the API's own answer and so the stable form for scripts."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, TypeVar

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from schemas.admin import Liveness

M = TypeVar("M", bound=BaseModel)

# Wide enough for any row of ours, so a pipe gets each on one line.
PIPE_WIDTH = 400

# Liveness (and job and deployment states) by colour: what needs a look stands out.
STYLES: dict[str, str] = {
    Liveness.ONLINE.value: "green",
    Liveness.STALE.value: "yellow",
    Liveness.OFFLINE.value: "red",
    Liveness.DISABLED.value: "magenta",
    Liveness.DECOMMISSIONED.value: "dim",
    "active": "green",
    "ready": "green",
    "succeeded": "green",
    "leased": "cyan",
    "queued": "cyan",
    "failed": "red",
    "expired": "dim",
    "revoked": "dim",
    "used": "dim",
    "cancelled": "dim",
    "missing": "bold red",
}


@dataclass(frozen=True)
class Column(Generic[M]):
    header: str
    value: Callable[[M], object]
    # Colour the cell by its value (STYLES).
    styled: bool = False


class Output:
    """Built once per command run; --json decides which of the two forms is written."""

    def __init__(self, json_mode: bool, console: Console | None = None) -> None:
        self.json_mode = json_mode
        self.console = console or _console()
        self.errors = Console(stderr=True, highlight=False)

    def json(self, model: BaseModel) -> None:
        # One line per answer: a watch then writes JSON Lines.
        sys.stdout.write(model.model_dump_json() + "\n")
        sys.stdout.flush()

    def table(
        self,
        answer: BaseModel,
        rows: Sequence[M],
        columns: Sequence[Column[M]],
        *,
        title: str | None = None,
    ) -> None:
        if self.json_mode:
            self.json(answer)
            return
        self.console.print(render_table(rows, columns, title=title))

    def detail(self, answer: BaseModel, fields: Iterable[tuple[str, object]]) -> None:
        if self.json_mode:
            self.json(answer)
            return
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        for name, value in fields:
            grid.add_row(name, styled(cell(value)))
        self.console.print(grid)

    def note(self, text: str) -> None:
        """A line for people (on stderr under --json, so stdout stays parseable)."""
        (self.errors if self.json_mode else self.console).print(text)


def _console() -> Console:
    """A terminal's width on a terminal; in a pipe, rows kept whole (ids unfolded, as
    `grep` and `awk` want them) unless COLUMNS says otherwise."""
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(highlight=False, width=PIPE_WIDTH)
    return console


def render_table(
    rows: Sequence[M], columns: Sequence[Column[M]], *, title: str | None = None
) -> Table:
    table = Table(title=title, box=None, header_style="bold", pad_edge=False)
    for column in columns:
        table.add_column(column.header, overflow="fold")
    for row in rows:
        table.add_row(
            *(
                styled(cell(column.value(row))) if column.styled else cell(column.value(row))
                for column in columns
            )
        )
    return table


def styled(text: str) -> str:
    style = STYLES.get(text)
    return f"[{style}]{text}[/]" if style else text.replace("[", r"\[")


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return ago(value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(value.items())) or "-"
    if isinstance(value, list | tuple | set):
        return ",".join(cell(v) for v in value) or "-"
    return str(getattr(value, "value", value))


def ago(at: datetime, now: datetime | None = None) -> str:
    """An instant as its age, the way `nomad node status` shows it."""
    seconds = int(((now or datetime.now(UTC)) - at).total_seconds())
    if seconds < 0:
        return at.isoformat(timespec="seconds")
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def size(count: int | None) -> str:
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(count)
