"""`modelforge admin tokens …`: enrollment tokens, created (the secret shown once),
listed and revoked."""

from __future__ import annotations

import uuid
from typing import Annotated

import typer

from cli.admin.answers import answer, show_page, show_row
from cli.admin.context import JsonOption, LimitOption, output
from cli.admin.output import Column
from schemas.admin import (
    CreateEnrollmentToken,
    EnrollmentTokenCreated,
    EnrollmentTokenInfo,
    EnrollmentTokenList,
    TokenState,
)
from schemas.protocol import TOKENS

app = typer.Typer(help="enrollment tokens: create, list, revoke")

TOKEN_COLUMNS: list[Column[EnrollmentTokenInfo]] = [
    Column("ID", lambda t: t.id),
    Column("STATE", lambda t: t.state, styled=True),
    Column("NAME", lambda t: t.display_name),
    Column("LABELS", lambda t: t.labels),
    Column("NODE", lambda t: t.node_id or t.used_by_node_id),
    Column("CREATED", lambda t: t.created_at),
    Column(
        "EXPIRES", lambda t: t.expires_at.isoformat(timespec="seconds") if t.expires_at else None
    ),
    Column("NOTE", lambda t: t.note),
]


def parse_labels(items: list[str]) -> dict[str, str]:
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"{item!r}: give key=value")
        labels[key] = value
    return labels


@app.command("create")
def create(
    ctx: typer.Context,
    expires_in: Annotated[int | None, typer.Option(help="seconds until it expires")] = None,
    label: Annotated[
        list[str] | None, typer.Option(help="key=value for the node; repeatable")
    ] = None,
    name: Annotated[str | None, typer.Option(help="the node's display name")] = None,
    note: Annotated[str | None, typer.Option()] = None,
    node: Annotated[
        uuid.UUID | None, typer.Option(help="re-bind this existing node (recovery)")
    ] = None,
    json: JsonOption = False,
) -> None:
    """A one-use enrollment token; its secret is printed once, on its own line."""
    out = output(json)
    body = CreateEnrollmentToken.model_validate(
        {
            k: v
            for k, v in {
                "expires_in_s": expires_in,
                "labels": parse_labels(label or []),
                "display_name": name,
                "note": note,
                "node_id": node,
            }.items()
            if v is not None
        }
    )
    created = answer(ctx, lambda c: c.post(EnrollmentTokenCreated, TOKENS, body))
    if out.json_mode:
        out.json(created)
        return
    out.table(created, [created.token], TOKEN_COLUMNS)
    out.error("the secret (shown once; give it to the agent's enrollment):")
    out.secret(created.secret)


@app.command("list")
def list_tokens(
    ctx: typer.Context,
    state: Annotated[TokenState | None, typer.Option()] = None,
    limit: LimitOption = 100,
    json: JsonOption = False,
) -> None:
    show_page(
        ctx,
        json,
        TOKEN_COLUMNS,
        lambda c: c.get(EnrollmentTokenList, TOKENS, state=state, limit=limit),
    )


@app.command("revoke")
def revoke(
    ctx: typer.Context,
    token: Annotated[uuid.UUID, typer.Argument(help="the token's id")],
    json: JsonOption = False,
) -> None:
    show_row(
        ctx, json, TOKEN_COLUMNS, lambda c: c.post(EnrollmentTokenInfo, f"{TOKENS}/{token}/revoke")
    )
