"""`modelforge admin service-clients …`: who may call the gateway (a secret each, shown
once), which models and roles, and their limits: requests at once, per minute, and
tokens per day."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import typer

from cli.admin.answers import answer, show_detail, show_page, show_row
from cli.admin.context import FormatOption, JsonOption, form, id_argument, output
from cli.admin.help import group
from cli.admin.output import Column, Format
from schemas.protocol import SERVICE_CLIENTS
from schemas.service_clients import (
    ServiceClientCreate,
    ServiceClientCreated,
    ServiceClientList,
    ServiceClientView,
)

app = group("Service clients: who may call the gateway, with their limits.")

ClientArg = Annotated[uuid.UUID, id_argument("the service client's id")]

CLIENT_COLUMNS: list[Column[ServiceClientView]] = [
    Column("ID", lambda c: c.id),
    Column("NAME", lambda c: c.name, flex=True),
    Column("STATE", lambda c: c.state, styled=True),
    Column("MODELS", lambda c: c.models, flex=2),
    Column("ROLES", lambda c: c.roles, flex=2),
    Column("MAX", lambda c: c.max_concurrent),
    Column("RATE/MIN", lambda c: c.rate_per_minute),
    Column("TOKENS/DAY", lambda c: c.max_tokens_per_day),
    Column("CREATED", lambda c: c.created_at),
    Column("ROTATED", lambda c: c.rotated_at, wide=True),
    Column("REVOKED", lambda c: c.revoked_at, wide=True),
]


@app.command("create")
def create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="its name, unique among clients not revoked")],
    model: Annotated[list[str] | None, typer.Option(help="a model it may call; repeatable")] = None,
    role: Annotated[list[str] | None, typer.Option(help="a role it may call; repeatable")] = None,
    max_concurrent: Annotated[
        int | None, typer.Option(help="requests at once (per API process)")
    ] = None,
    rate_per_minute: Annotated[
        int | None, typer.Option(help="requests per minute (per API process)")
    ] = None,
    max_tokens_per_day: Annotated[
        int | None,
        typer.Option(help="prompt and completion tokens per UTC day; then 429 budget_exhausted"),
    ] = None,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """Create a service client; its secret is printed once, on its own line."""
    values: dict[str, Any] = {"name": name, "models": model or [], "roles": role or []}
    limits = {
        "max_concurrent": max_concurrent,
        "rate_per_minute": rate_per_minute,
        "max_tokens_per_day": max_tokens_per_day,
    }
    values.update({k: v for k, v in limits.items() if v is not None})
    body = ServiceClientCreate.model_validate(values)
    created = answer(ctx, lambda c: c.post(ServiceClientCreated, SERVICE_CLIENTS, body))
    _secret(form(json, fmt), created)


@app.command("list")
def list_clients(ctx: typer.Context, json: JsonOption = False, fmt: FormatOption = None) -> None:
    """The service clients: scope, limits, state."""
    show_page(
        ctx, form(json, fmt), CLIENT_COLUMNS, lambda c: c.get(ServiceClientList, SERVICE_CLIENTS)
    )


@app.command("get")
def get(
    ctx: typer.Context, client_id: ClientArg, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """One service client: scope, limits, state and when it was created, rotated, revoked."""
    show_detail(
        ctx,
        form(json, fmt),
        lambda c: c.get(ServiceClientView, f"{SERVICE_CLIENTS}/{client_id}"),
    )


@app.command("rotate")
def rotate(
    ctx: typer.Context, client_id: ClientArg, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """A new secret (printed once); the old one is refused from now on."""
    created = answer(
        ctx, lambda c: c.post(ServiceClientCreated, f"{SERVICE_CLIENTS}/{client_id}/rotate")
    )
    _secret(form(json, fmt), created)


@app.command("revoke")
def revoke(
    ctx: typer.Context, client_id: ClientArg, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """Refuse the client's calls from now on (not reversible)."""
    show_row(
        ctx,
        form(json, fmt),
        CLIENT_COLUMNS,
        lambda c: c.post(ServiceClientView, f"{SERVICE_CLIENTS}/{client_id}/revoke"),
    )


def _secret(how: Format, created: ServiceClientCreated) -> None:
    output(how).created(created, created, CLIENT_COLUMNS, created.secret)
