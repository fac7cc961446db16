"""Listing jobs, the one way every kind's command does it (`jobs list`, `runtime probes
list`): the same filters (node, state, limit) sent as the same query, one table, or the
page's JSON with --json. A kind's command differs only in its page model, its route and
its columns."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Annotated, Any, Protocol, TypeVar, runtime_checkable

import typer
from pydantic import BaseModel

from cli.admin.context import admin, output
from cli.admin.output import Column
from schemas.jobs import JobState, JobView

NodeFilter = Annotated[uuid.UUID | None, typer.Option("--node", help="only this node's")]
StateFilter = Annotated[list[JobState] | None, typer.Option("--state", help="repeatable")]


@runtime_checkable
class JobPage(Protocol):
    """What every kind's list answer has: its jobs, each a JobView of that kind."""

    @property
    def items(self) -> Sequence[JobView]: ...


P = TypeVar("P", bound=BaseModel)


def show_jobs(
    ctx: typer.Context,
    page: type[P],
    route: str,
    columns: Sequence[Column[Any]],
    *,
    node: uuid.UUID | None,
    state: list[JobState] | None,
    limit: int,
    json: bool,
) -> None:
    out = output(json)
    with admin(ctx).client() as client:
        found = client.get(
            page, route, node_id=node, state=[s.value for s in state or []], limit=limit
        )
    if not isinstance(found, JobPage):
        raise TypeError(f"{page.__name__} is not a page of jobs")
    out.table(found, found.items, columns)
