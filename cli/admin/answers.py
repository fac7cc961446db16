"""The shape most `modelforge admin` commands have: one call to the API, then its answer
shown as a page's table, one row, or a key/value panel (the answer's JSON with --json).
A command says which call and which columns; how the client is opened and closed and
how --json is honoured is written here once."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import typer
from pydantic import BaseModel

from cli.admin.client import AdminClient
from cli.admin.context import admin, output
from cli.admin.output import Column, Format, fields_of

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


@runtime_checkable
class Page(Protocol):
    """What every list answer has: its items, one row each."""

    @property
    def items(self) -> Sequence[Any]: ...


def answer(ctx: typer.Context, call: Callable[[AdminClient], T]) -> T:
    """call's answer, over a client opened for it and closed after."""
    with admin(ctx).client() as client:
        return call(client)


def show_page(
    ctx: typer.Context,
    how: Format,
    columns: Sequence[Column[Any]],
    call: Callable[[AdminClient], M],
) -> M:
    """A list answer: its items as a table."""
    found = answer(ctx, call)
    if not isinstance(found, Page):
        raise TypeError(f"{type(found).__name__} is not a page")
    output(how).table(found, found.items, columns)
    return found


def show_row(
    ctx: typer.Context, how: Format, columns: Sequence[Column[M]], call: Callable[[AdminClient], M]
) -> M:
    """One object (created, changed) as a table's one row."""
    view = answer(ctx, call)
    output(how).table(view, [view], columns)
    return view


def show_detail(
    ctx: typer.Context,
    how: Format,
    call: Callable[[AdminClient], M],
    fields: Callable[[M], Iterable[tuple[str, object]]] = fields_of,
) -> M:
    """One object as a key/value panel: its fields, or those `fields` makes of it."""
    view = answer(ctx, call)
    output(how).detail(view, fields(view))
    return view
