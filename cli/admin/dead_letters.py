"""`modelforge admin dead-letters …`: worker messages that will not run again on their
own; look, replay, or delete."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.admin.context import JsonOption, admin, output
from cli.admin.output import Column
from schemas.admin import DeadLetterInfo, DeadLetterList, DeadLetterReplayed
from schemas.protocol import DEAD_LETTERS

app = typer.Typer(help="dead letters: list, get, replay, delete")

SeqArg = Annotated[int, typer.Argument(min=1, help="the dead letter's sequence")]

COLUMNS: list[Column[DeadLetterInfo]] = [
    Column("SEQ", lambda d: d.seq),
    Column("QUEUE", lambda d: d.queue),
    Column("ACTOR", lambda d: d.actor_name),
    Column("REASON", lambda d: d.reason),
    Column("ERROR", lambda d: f"{d.exception_type}: {d.error}"),
    Column("DELIVERIES", lambda d: d.deliveries),
    Column("FAILED", lambda d: d.failed_at),
]


@app.command("list")
def list_dead_letters(
    ctx: typer.Context,
    queue: Annotated[str | None, typer.Option()] = None,
    after_seq: Annotated[int, typer.Option(min=0)] = 0,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
    json: JsonOption = False,
) -> None:
    out = output(json)
    with admin(ctx).client() as client:
        found = client.get(
            DeadLetterList, DEAD_LETTERS, queue=queue, after_seq=after_seq, limit=limit
        )
    out.table(found, found.items, COLUMNS)
    if found.next_seq is not None and not out.json_mode:
        out.note(f"more: --after-seq {found.next_seq}")


@app.command("get")
def get(ctx: typer.Context, seq: SeqArg, json: JsonOption = False) -> None:
    out = output(json)
    with admin(ctx).client() as client:
        info = client.get(DeadLetterInfo, f"{DEAD_LETTERS}/{seq}")
    out.detail(info, info.model_dump().items())


@app.command("replay")
def replay(ctx: typer.Context, seq: SeqArg, json: JsonOption = False) -> None:
    """Send the message to its queue again, as it was."""
    out = output(json)
    with admin(ctx).client() as client:
        done = client.post(DeadLetterReplayed, f"{DEAD_LETTERS}/{seq}/replay")
    out.detail(done, done.model_dump().items())


@app.command("delete")
def delete(ctx: typer.Context, seq: SeqArg) -> None:
    with admin(ctx).client() as client:
        client.request("DELETE", f"{DEAD_LETTERS}/{seq}")
    output(False).line(f"deleted dead letter {seq}")
