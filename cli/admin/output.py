"""How `modelforge admin` shows what it got: a table (coloured on a terminal, plain in a
pipe), a key/value panel for one object, or the wire model's JSON with --json, which is
the API's own answer and so the stable form for scripts.

Every command prints through Output, and Output prints only Text built by
cli/terminal.py: a hostname, a label or a server's message is shown as the characters it
is, never read as Rich markup nor sent as a control sequence. Its consoles parse no
markup either, so a str that reached one some other way would still print as written."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cli.terminal import literal, visible
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
        self.errors = _plain_console(stderr=True)

    def json(self, model: BaseModel) -> None:
        # One line per answer: a watch then writes JSON Lines. JSON's own escapes keep
        # it exact; a script reads the API's answer, hidden characters and all.
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
        self.rows(rows, columns, title=title)

    def rows(
        self, rows: Sequence[M], columns: Sequence[Column[M]], *, title: str | None = None
    ) -> None:
        """The table alone, whatever --json says (a watch's first view, a patch's row)."""
        self.console.print(render_table(rows, columns, title=title))

    def detail(self, answer: BaseModel, fields: Iterable[tuple[str, object]]) -> None:
        if self.json_mode:
            self.json(answer)
            return
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        for name, value in fields:
            grid.add_row(literal(name), styled(cell(value)))
        self.console.print(grid)

    def line(self, *parts: str | Text) -> None:
        """One line on stdout: each str shown as written, each Text (styled(), literal())
        as it was built."""
        self.console.print(join(*parts))

    def note(self, *parts: str | Text, style: str | None = None) -> None:
        """A line for people (on stderr under --json, so stdout stays parseable)."""
        (self.errors if self.json_mode else self.console).print(join(*parts, style=style))

    def error(self, *parts: str | Text) -> None:
        """A line on stderr, whatever --json says."""
        self.errors.print(join(*parts))

    def secret(self, value: str) -> None:
        """A secret shown once, alone on its line with nothing around it, for copying."""
        print(visible(value), flush=True)


def join(*parts: str | Text, style: str | None = None) -> Text:
    """The parts as one Text: each str literal (cli/terminal.py), each Text as it is."""
    line = Text(style=style or "")
    for part in parts:
        line.append_text(literal(part) if isinstance(part, str) else part)
    return line


def _plain_console(**options: Any) -> Console:
    # No markup, emoji codes or highlighting from any str: what we print is Text.
    return Console(highlight=False, markup=False, emoji=False, **options)


def _console() -> Console:
    """A terminal's width on a terminal; in a pipe, rows kept whole (ids unfolded, as
    `grep` and `awk` want them) unless COLUMNS says otherwise."""
    console = _plain_console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = _plain_console(width=PIPE_WIDTH)
    return console


def render_table(
    rows: Sequence[M], columns: Sequence[Column[M]], *, title: str | None = None
) -> Table:
    table = Table(
        title=literal(title) if title is not None else None,
        box=None,
        header_style="bold",
        pad_edge=False,
    )
    for column in columns:
        table.add_column(column.header, overflow="fold")
    for row in rows:
        table.add_row(
            *((styled if column.styled else literal)(cell(column.value(row))) for column in columns)
        )
    return table


def styled(text: str) -> Text:
    """text coloured by what it says (STYLES: a liveness, a state), else as it is."""
    return literal(text, STYLES.get(text))


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
