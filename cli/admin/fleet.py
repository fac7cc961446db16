"""`modelforge admin fleet …`: the partition breaker and its incidents."""

from __future__ import annotations

import uuid
from typing import Annotated

import typer

from cli.admin.answers import answer, show_page, show_row
from cli.admin.context import JsonOption, LimitOption, output
from cli.admin.output import Column
from schemas.admin import (
    AcknowledgeIncident,
    FleetIncidentInfo,
    FleetIncidentList,
    FleetSafety,
)
from schemas.protocol import FLEET

app = typer.Typer(help="fleet safety: the partition breaker, incidents, acknowledge")

INCIDENT_COLUMNS: list[Column[FleetIncidentInfo]] = [
    Column("ID", lambda i: i.id),
    Column("KIND", lambda i: i.kind),
    Column("OPENED", lambda i: i.opened_at),
    Column("SILENT/WATCHED", lambda i: f"{i.silent_nodes}/{i.watched_nodes}"),
    Column("ACKNOWLEDGED", lambda i: i.acknowledged_at),
    Column("REASON", lambda i: i.acknowledged_reason),
    Column("RESOLVED", lambda i: i.resolved_at),
]


@app.command("status")
def status(ctx: typer.Context, json: JsonOption = False) -> None:
    """Is the partition breaker holding offline transitions, and why."""
    safety = answer(ctx, lambda c: c.get(FleetSafety, FLEET))
    incident = safety.open_incident
    presence = safety.api_presence
    output(json).detail(
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
def incidents(ctx: typer.Context, limit: LimitOption = 100, json: JsonOption = False) -> None:
    show_page(
        ctx,
        json,
        INCIDENT_COLUMNS,
        lambda c: c.get(FleetIncidentList, f"{FLEET}/incidents", limit=limit),
    )


@app.command("acknowledge")
def acknowledge(
    ctx: typer.Context,
    incident: Annotated[uuid.UUID, typer.Argument(help="the incident's id")],
    reason: Annotated[str, typer.Option(help="why the silent nodes are really gone (audited)")],
    json: JsonOption = False,
) -> None:
    """Let the held offline transitions through."""
    show_row(
        ctx,
        json,
        INCIDENT_COLUMNS,
        lambda c: c.post(
            FleetIncidentInfo,
            f"{FLEET}/incidents/{incident}/acknowledge",
            AcknowledgeIncident(reason=reason),
        ),
    )
