"""How `modelforge admin` shows what it got: a table (coloured on a terminal, plain in a
pipe; cli/admin/tables.py), the same table with every column and whole values (`-o
wide`), a key/value panel for one object, or the wire model's JSON (`-o json`, or
--json), which is the API's own answer and so the stable form for scripts.

Every command prints through Output, and Output prints only Text built by
cli/terminal.py: a hostname, a label or a server's message is shown as the characters it
is, never read as Rich markup nor sent as a control sequence. Its consoles parse no
markup either, so a str that reached one some other way would still print as written."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cli.admin.cells import ago, cell, detail_value, iso, label, short, size, styled
from cli.admin.tables import Column, natural_width, render_table
from cli.terminal import literal, visible

__all__ = [
    "Column",
    "Format",
    "Output",
    "ago",
    "cell",
    "fields_of",
    "iso",
    "join",
    "label",
    "short",
    "size",
    "styled",
]

M = TypeVar("M")

# Wide enough for any row of ours, so a pipe gets each on one line.
PIPE_WIDTH = 400


class Format(StrEnum):
    """-o: how an answer is shown."""

    TABLE = "table"
    WIDE = "wide"
    JSON = "json"


class Output:
    """Built once per command run; -o (or --json) decides which form is written."""

    def __init__(self, form: Format | bool = Format.TABLE, console: Console | None = None) -> None:
        # A bool is --json's answer, as every command had it.
        if isinstance(form, bool):
            form = Format.JSON if form else Format.TABLE
        self.form = form
        self.console = console or _console()
        self.errors = _plain_console(stderr=True)

    @property
    def json_mode(self) -> bool:
        return self.form is Format.JSON

    @property
    def wide(self) -> bool:
        return self.form is Format.WIDE

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
        """The table alone, whatever -o says (a watch's first view, a get's part); a
        titled one (a part of a `get`) set off by a blank line."""
        if title is not None:
            self.console.print()
        console = self.console
        if self.wide:
            # Every value whole: the row is as long as it is, and the terminal wraps it
            # (as `kubectl -o wide` does), rather than the table folding a cell.
            console = self._wider(natural_width(rows, columns, wide=True))
        console.print(render_table(rows, columns, width=console.width, wide=self.wide, title=title))

    def detail(self, answer: BaseModel, fields: Iterable[tuple[str, object]]) -> None:
        """One object as labelled keys (Title Case, aligned); its JSON with -o json."""
        if self.json_mode:
            self.json(answer)
            return
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(overflow="fold")
        for name, value in fields:
            shown = value if isinstance(value, Text) else styled(detail_value(value))
            grid.add_row(literal(label(name) + ":"), shown)
        self.console.print(grid)

    def line(self, *parts: str | Text) -> None:
        """One line on stdout: each str shown as written, each Text (styled(), literal())
        as it was built."""
        self.console.print(join(*parts))

    def row_line(self, *parts: str | Text) -> None:
        """One line that stays one line (a watch's event row): cut with an ellipsis at
        the terminal's width, unless -o wide."""
        if self.wide:
            self.console.print(join(*parts), soft_wrap=True)
        else:
            self.console.print(join(*parts), no_wrap=True, overflow="ellipsis", crop=True)

    def note(self, *parts: str | Text, style: str | None = None) -> None:
        """A line for people (on stderr under -o json, so stdout stays parseable)."""
        (self.errors if self.json_mode else self.console).print(join(*parts, style=style))

    def error(self, *parts: str | Text) -> None:
        """A line on stderr, whatever -o says."""
        self.errors.print(join(*parts))

    def created(
        self,
        answer: BaseModel,
        row: M,
        columns: Sequence[Column[M]],
        secret: str,
        note: str = "the secret (shown once):",
    ) -> None:
        """What was created with a secret: its row, then the note on stderr and the
        secret alone on the last line of stdout (for `$(…)` and copying); its JSON with
        -o json, the secret in it."""
        if self.json_mode:
            self.json(answer)
            return
        self.rows([row], columns)
        self.error(note)
        self.secret(secret)

    def secret(self, value: str) -> None:
        """A secret shown once, alone on its line with nothing around it, for copying."""
        print(visible(value), flush=True)

    def _wider(self, width: int) -> Console:
        if width <= self.console.width:
            return self.console
        return _plain_console(
            file=self.console.file,
            width=width,
            force_terminal=self.console.is_terminal,
            color_system=self.console.color_system,
        )

    def id(self, value: object) -> str:
        """An id as this form shows it in a line: short, or whole in -o wide."""
        return cell(value, wide=self.wide)


def fields_of(model: BaseModel, prefix: str = "") -> list[tuple[str, object]]:
    """A model's fields as a `get` shows them, in the model's order: a nested model's
    fields each under its own key ("Artifact Commit"), never as `commit=…,path=…`."""
    found: list[tuple[str, object]] = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        key = f"{prefix} {name}" if prefix else name
        if isinstance(value, BaseModel):
            found.extend(fields_of(value, key))
        else:
            found.append((key, value))
    return found


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
    """A terminal's width on a terminal; in a pipe, rows kept whole unless COLUMNS says
    otherwise."""
    console = _plain_console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = _plain_console(width=PIPE_WIDTH)
    return console
