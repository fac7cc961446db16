"""`modelforge admin audit`: who did what to which object, newest first."""

from __future__ import annotations

import uuid
from typing import Annotated

import typer

from cli.admin.cells import ident, short
from cli.admin.context import FormatOption, JsonOption, LimitOption, admin, output
from cli.admin.output import Column
from schemas.admin import AuditList, AuditRecord
from schemas.protocol import AUDIT


def actor(record: AuditRecord) -> str:
    """The actor as a table shows it: a node's id short ("node:057b87d2"), as the
    TARGET ID beside it is; whole in -o wide."""
    kind, colon, rest = record.actor.partition(":")
    found = ident(rest) if colon else None
    return f"{kind}:{short(found)}" if isinstance(found, uuid.UUID) else record.actor


AUDIT_COLUMNS: list[Column[AuditRecord]] = [
    Column("ID", lambda r: r.id),
    Column("AT", lambda r: r.at),
    Column("ACTOR", actor, full=lambda r: r.actor, flex=True),
    Column("ACTION", lambda r: r.action, flex=True),
    Column("TARGET", lambda r: r.target_type, flex=True),
    Column("TARGET ID", lambda r: ident(r.target_id)),
    # Left out first on a narrow terminal: --correlation-id needs the whole id, which is
    # in -o wide.
    Column("CORRELATION", lambda r: ident(r.correlation_id), optional=True),
]


def audit(
    ctx: typer.Context,
    actor: Annotated[
        str | None, typer.Option(help="who: operator, or node:ID for a node's own requests")
    ] = None,
    action: Annotated[str | None, typer.Option(help="what, e.g. node.disabled")] = None,
    kind: Annotated[
        str | None, typer.Option(help="the action's family, e.g. node for node.*")
    ] = None,
    node: Annotated[
        str | None,
        typer.Option(help="a node's whole id: its own rows and those naming it"),
    ] = None,
    health_checks: Annotated[
        bool, typer.Option("--health-checks", help="also the periodic health-check jobs' rows")
    ] = False,
    target_type: Annotated[str | None, typer.Option(help="the object's kind, e.g. node")] = None,
    target_id: Annotated[str | None, typer.Option(help="the object's whole id")] = None,
    correlation_id: Annotated[
        str | None, typer.Option(help="everything one request caused")
    ] = None,
    since: Annotated[str | None, typer.Option(help="an ISO 8601 instant")] = None,
    until: Annotated[str | None, typer.Option(help="an ISO 8601 instant")] = None,
    before_id: Annotated[int | None, typer.Option(help="the page before this record")] = None,
    limit: LimitOption = 100,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """The audit log: who did what to which object, newest first.

    It is written from the event stream by a worker, so it trails a change by the
    relay's delay."""
    out = output(json, fmt)
    with admin(ctx).client() as client:
        found = client.get(
            AuditList,
            AUDIT,
            actor=actor,
            action=action,
            kind=kind,
            node_id=node,
            # Sent only when asked for: the API leaves them out by default.
            health_checks="true" if health_checks else None,
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
