"""Listing jobs, the one way every kind's command does it (`jobs list`, `runtime probes
list`): the same filters (node, state, limit) sent as the same query, one table, or the
page's JSON with --json. A kind's command differs only in its page model, its route and
its columns."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer
from pydantic import BaseModel

from cli.admin.answers import show_page
from cli.admin.context import FormatOption, JsonOption, LimitOption, form, id_option
from cli.admin.output import Column
from schemas.jobs import JobState

NodeFilter = Annotated[uuid.UUID | None, id_option("only this node's")]
StateFilter = Annotated[list[JobState] | None, typer.Option("--state", help="repeatable")]


def list_command(
    page: type[BaseModel], route: str, columns: Sequence[Column[Any]], description: str
) -> Callable[..., None]:
    """The `list` command of one family's jobs: its page model, its route, its columns."""

    def list_jobs(
        ctx: typer.Context,
        node: NodeFilter = None,
        state: StateFilter = None,
        limit: LimitOption = 100,
        json: JsonOption = False,
        fmt: FormatOption = None,
    ) -> None:
        query = {"node_id": node, "state": state, "limit": limit}
        show_page(ctx, form(json, fmt), columns, lambda c: c.get(page, route, **query))

    list_jobs.__doc__ = description
    return list_jobs
