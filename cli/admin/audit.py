"""`modelforge admin audit`: who did what to which object, newest first."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.admin.context import JsonOption, LimitOption, admin, output
from cli.admin.output import Column
from schemas.admin import AuditList, AuditRecord
from schemas.protocol import AUDIT

AUDIT_COLUMNS: list[Column[AuditRecord]] = [
    Column("ID", lambda r: r.id),
    Column("AT", lambda r: r.at.isoformat(timespec="seconds")),
    Column("ACTOR", lambda r: r.actor),
    Column("ACTION", lambda r: r.action),
    Column("TARGET", lambda r: f"{r.target_type}/{r.target_id}"),
    Column("CORRELATION", lambda r: r.correlation_id),
]

Filter = Annotated[str | None, typer.Option()]


def audit(
    ctx: typer.Context,
    actor: Filter = None,
    action: Filter = None,
    target_type: Filter = None,
    target_id: Filter = None,
    correlation_id: Annotated[
        str | None, typer.Option(help="everything one request caused")
    ] = None,
    since: Annotated[str | None, typer.Option(help="an ISO 8601 instant")] = None,
    until: Annotated[str | None, typer.Option(help="an ISO 8601 instant")] = None,
    before_id: Annotated[int | None, typer.Option(help="the page before this record")] = None,
    limit: LimitOption = 100,
    json: JsonOption = False,
) -> None:
    """The audit log (written from the event stream by a worker, so it trails a change
    by the relay's delay)."""
    out = output(json)
    with admin(ctx).client() as client:
        found = client.get(
            AuditList,
            AUDIT,
            actor=actor,
            action=action,
            target_type=target_type,
            target_id=target_id,
            correlation_id=correlation_id,
            since=since,
            until=until,
            before_id=before_id,
            limit=limit,
        )
    out.table(found, found.items, AUDIT_COLUMNS)
    if found.next_before_id is not None and not out.json_mode:
        out.note(f"more: --before-id {found.next_before_id}")
