"""`modelforge admin dead-letters …`: worker messages that will not run again on their
own; look, replay, or delete."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.admin.answers import answer, show_detail, show_page
from cli.admin.context import JsonOption, output
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
    found = show_page(
        ctx,
        json,
        COLUMNS,
        lambda c: c.get(
            DeadLetterList, DEAD_LETTERS, queue=queue, after_seq=after_seq, limit=limit
        ),
    )
    if found.next_seq is not None and not json:
        output(json).note(f"more: --after-seq {found.next_seq}")


@app.command("get")
def get(ctx: typer.Context, seq: SeqArg, json: JsonOption = False) -> None:
    show_detail(ctx, json, lambda c: c.get(DeadLetterInfo, f"{DEAD_LETTERS}/{seq}"))


@app.command("replay")
def replay(ctx: typer.Context, seq: SeqArg, json: JsonOption = False) -> None:
    """Send the message to its queue again, as it was."""
    show_detail(ctx, json, lambda c: c.post(DeadLetterReplayed, f"{DEAD_LETTERS}/{seq}/replay"))


@app.command("delete")
def delete(ctx: typer.Context, seq: SeqArg) -> None:
    answer(ctx, lambda c: c.request("DELETE", f"{DEAD_LETTERS}/{seq}"))
    output(False).line(f"deleted dead letter {seq}")
