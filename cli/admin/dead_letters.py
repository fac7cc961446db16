"""`modelforge admin dead-letters …`: worker messages that will not run again on their
own; look, replay, or delete."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.admin.answers import answer, show_detail, show_page
from cli.admin.context import FormatOption, JsonOption, form, output
from cli.admin.help import group
from cli.admin.output import Column, Format
from schemas.admin import DeadLetterInfo, DeadLetterList, DeadLetterReplayed
from schemas.protocol import DEAD_LETTERS

app = group("Dead letters: worker messages that will not run again on their own.")

SeqArg = Annotated[int, typer.Argument(min=1, help="the dead letter's sequence")]

COLUMNS: list[Column[DeadLetterInfo]] = [
    Column("SEQ", lambda d: d.seq),
    Column("QUEUE", lambda d: d.queue, flex=True),
    Column("ACTOR", lambda d: d.actor_name, flex=True),
    Column("REASON", lambda d: d.reason, flex=True),
    Column("ERROR", lambda d: f"{d.exception_type}: {d.error}", flex=True),
    Column("DELIVERIES", lambda d: d.deliveries),
    Column("FAILED", lambda d: d.failed_at),
]


@app.command("list")
def list_dead_letters(
    ctx: typer.Context,
    queue: Annotated[str | None, typer.Option(help="only this queue's")] = None,
    after_seq: Annotated[
        int, typer.Option(min=0, help="the page after this SEQ (the last line says which)")
    ] = 0,
    limit: Annotated[int, typer.Option(min=1, max=500, help="at most this many")] = 50,
    json: JsonOption = False,
    fmt: FormatOption = None,
) -> None:
    """The dead letters, oldest first (page on with --after-seq)."""
    found = show_page(
        ctx,
        form(json, fmt),
        COLUMNS,
        lambda c: c.get(
            DeadLetterList, DEAD_LETTERS, queue=queue, after_seq=after_seq, limit=limit
        ),
    )
    if found.next_seq is not None and form(json, fmt) is not Format.JSON:
        output(json, fmt).note(f"more: --after-seq {found.next_seq}")


@app.command("get")
def get(
    ctx: typer.Context, seq: SeqArg, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """One dead letter: its queue, actor, error and the message as it was."""
    show_detail(ctx, form(json, fmt), lambda c: c.get(DeadLetterInfo, f"{DEAD_LETTERS}/{seq}"))


@app.command("replay")
def replay(
    ctx: typer.Context, seq: SeqArg, json: JsonOption = False, fmt: FormatOption = None
) -> None:
    """Send the message to its queue again, as it was."""
    show_detail(
        ctx, form(json, fmt), lambda c: c.post(DeadLetterReplayed, f"{DEAD_LETTERS}/{seq}/replay")
    )


@app.command("delete")
def delete(ctx: typer.Context, seq: SeqArg) -> None:
    """Delete the dead letter for good."""
    answer(ctx, lambda c: c.request("DELETE", f"{DEAD_LETTERS}/{seq}"))
    output(False).line(f"deleted dead letter {seq}")
