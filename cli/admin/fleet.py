"""`modelforge admin fleet …`: the partition breaker and its incidents."""

from __future__ import annotations

import uuid
from typing import Annotated

import typer

from cli.admin.answers import answer, show_page, show_row
from cli.admin.context import FormatOption, JsonOption, LimitOption, form, id_argument, output
from cli.admin.help import group
from cli.admin.output import Column
from schemas.admin import (
    AcknowledgeIncident,
    FleetIncidentInfo,
    FleetIncidentList,
    FleetSafety,
)
from schemas.protocol import FLEET

app = group("Fleet safety: the partition breaker and its incidents.")

INCIDENT_COLUMNS: list[Column[FleetIncidentInfo]] = [
    Column("ID", lambda i: i.id),
    Column("KIND", lambda i: i.kind, flex=True),
    Column("OPENED", lambda i: i.opened_at),
    Column("SILENT/WATCHED", lambda i: f"{i.silent_nodes}/{i.watched_nodes}"),
    Column("ACKNOWLEDGED", lambda i: i.acknowledged_at),
    Column("REASON", lambda i: i.acknowledged_reason, flex=True),
    Column("RESOLVED", lambda i: i.resolved_at),
]


@app.command("status")
def status(ctx: typer.Context, json: JsonOption = False, fmt: FormatOption = None) -> None:
    """Is the partition breaker holding offline transitions, and why."""
    safety = answer(ctx, lambda c: c.get(FleetSafety, FLEET))
    incident = safety.open_incident
    presence = safety.api_presence
    output(json, fmt).detail(
        safety,
        [
            ("partition hold", safety.partition_hold),
            ("open incident", incident.id if incident else None),
            (
                "silent nodes",
                f"{incident.silent_nodes}/{incident.watched_nodes}" if incident else None,
            ),
            ("API last seen", presence.last_seen_at if presence else None),
        ],
    )


@app.command("incidents")
def incidents(
    ctx: typer.Context, limit: LimitOption = 100, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """The partition breaker's incidents, newest first."""
    show_page(
        ctx,
        form(json, fmt),
        INCIDENT_COLUMNS,
        lambda c: c.get(FleetIncidentList, f"{FLEET}/incidents", limit=limit),
    )


@app.command("acknowledge")
def acknowledge(
    ctx: typer.Context,
    incident: Annotated[uuid.UUID, id_argument("the incident's id")],
    reason: Annotated[str, typer.Option(help="why the silent nodes are really gone (audited)")],
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """Let the held offline transitions through."""
    show_row(
        ctx,
        form(json, fmt),
        INCIDENT_COLUMNS,
        lambda c: c.post(
            FleetIncidentInfo,
            f"{FLEET}/incidents/{incident}/acknowledge",
            AcknowledgeIncident(reason=reason),
        ),
    )
