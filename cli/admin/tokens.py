"""`modelforge admin tokens …`: enrollment tokens, created (the secret shown once),
listed and revoked."""

from __future__ import annotations

import uuid
from typing import Annotated

import typer

from cli.admin.answers import answer, show_page, show_row
from cli.admin.context import (
    FormatOption,
    JsonOption,
    LimitOption,
    form,
    id_argument,
    id_option,
    output,
)
from cli.admin.help import group
from cli.admin.output import Column
from schemas.admin import (
    CreateEnrollmentToken,
    EnrollmentTokenCreated,
    EnrollmentTokenInfo,
    EnrollmentTokenList,
    TokenState,
)
from schemas.protocol import TOKENS

app = group("Enrollment tokens: one-use secrets a new node enrolls with.")

TOKEN_COLUMNS: list[Column[EnrollmentTokenInfo]] = [
    Column("ID", lambda t: t.id),
    Column("STATE", lambda t: t.state, styled=True),
    Column("NAME", lambda t: t.display_name, flex=True),
    Column("LABELS", lambda t: t.labels, flex=True),
    Column("NODE", lambda t: t.node_id or t.used_by_node_id),
    Column("CREATED", lambda t: t.created_at),
    Column("EXPIRES", lambda t: t.expires_at),
    Column("NOTE", lambda t: t.note, flex=True),
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
    note: Annotated[str | None, typer.Option(help="free text kept with the token")] = None,
    node: Annotated[uuid.UUID | None, id_option("re-bind this existing node (recovery)")] = None,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """A one-use enrollment token; its secret is printed once, on its own line."""
    out = output(json, fmt)
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
    out.created(
        created,
        created.token,
        TOKEN_COLUMNS,
        created.secret,
        "the secret (shown once; give it to the agent's enrollment):",
    )


@app.command("list")
def list_tokens(
    ctx: typer.Context,
    state: Annotated[TokenState | None, typer.Option(help="only tokens in this state")] = None,
    limit: LimitOption = 100,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """The enrollment tokens: state, labels, the node that used one."""
    show_page(
        ctx,
        form(json, fmt),
        TOKEN_COLUMNS,
        lambda c: c.get(EnrollmentTokenList, TOKENS, state=state, limit=limit),
    )


@app.command("revoke")
def revoke(
    ctx: typer.Context,
    token: Annotated[uuid.UUID, id_argument("the token's id")],
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """Revoke an unused token: an enrollment with it is refused."""
    show_row(
        ctx,
        form(json, fmt),
        TOKEN_COLUMNS,
        lambda c: c.post(EnrollmentTokenInfo, f"{TOKENS}/{token}/revoke"),
    )
