"""`modelforge admin usage`: the gateway's invokes per service client and served model
(GET USAGE, from the rollup): requests, errors by code, tokens in and out, and the time
to first token's p50/p99, per bucket of --step; a table, its JSON, or CSV for a
spreadsheet."""

from __future__ import annotations

import csv
import re
import sys
import uuid
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Final, TextIO

import typer

from cli.admin.answers import answer
from cli.admin.cells import millis
from cli.admin.client import AdminClient, AdminFailure
from cli.admin.context import JsonOption, output
from cli.admin.output import Column, Format, iso
from schemas.protocol import SERVICE_CLIENTS
from schemas.service_clients import ServiceClientList
from schemas.usage import USAGE, UsageReport, UsageRow, UsageStep

# "90m", "6h", "7d": that long before now.
SPAN: Final = re.compile(r"^(?P<count>\d+)(?P<unit>[smhd])$")
UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
CSV_FIELDS: Final = (
    "start",
    "client_id",
    "client_name",
    "model",
    "requests",
    "errors",
    "errors_by_code",
    "prompt_tokens",
    "completion_tokens",
    "ttft_count",
    "ttft_p50_s",
    "ttft_p99_s",
)
# What a spreadsheet reads as the start of a formula (OWASP's CSV injection list): a
# client's name or a model that begins so is written after a single quote, as text.
FORMULA_STARTS: Final = ("=", "+", "-", "@", "\t", "\r")


class UsageFormat(StrEnum):
    TABLE = "table"
    WIDE = "wide"
    JSON = "json"
    CSV = "csv"


def _errors(row: UsageRow) -> int:
    return sum(row.errors.values())


def _by_code(errors: dict[str, int]) -> str:
    return ",".join(f"{code}={count}" for code, count in sorted(errors.items())) or "-"


def _ms(value: float | None) -> str | None:
    return None if value is None else millis(value)


USAGE_COLUMNS: list[Column[UsageRow]] = [
    Column("START", lambda r: r.start),
    Column("CLIENT", lambda r: r.client_name or r.client_id, flex=True),
    Column("MODEL", lambda r: r.model, flex=True),
    Column("REQUESTS", lambda r: r.requests),
    Column("ERRORS", _errors, full=lambda r: _by_code(r.errors) if r.errors else 0),
    Column("TOKENS IN", lambda r: r.prompt_tokens),
    Column("TOKENS OUT", lambda r: r.completion_tokens),
    Column("TTFT P50", lambda r: _ms(r.ttft_p50_s)),
    Column("TTFT P99", lambda r: _ms(r.ttft_p99_s)),
    Column("CLIENT ID", lambda r: r.client_id, wide=True),
]


def instant(text: str | None, now: datetime) -> datetime | None:
    """An option's instant: ISO 8601, or a span before now ("90m", "6h", "7d")."""
    if text is None:
        return None
    span = SPAN.match(text)
    if span is not None:
        return now - timedelta(seconds=int(span["count"]) * UNITS[span["unit"]])
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(
            f"{text!r}: give an ISO 8601 instant (2026-12-05T09:00Z) or a span (90m, 6h, 7d)"
        ) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def client_id(client: AdminClient, given: str) -> uuid.UUID:
    """An id as it is; a name as the id of the client of that name (the one not
    revoked, where several had it)."""
    try:
        return uuid.UUID(given)
    except ValueError:
        pass
    named = [c for c in client.get(ServiceClientList, SERVICE_CLIENTS).items if c.name == given]
    if not named:
        raise AdminFailure(f"no service client named {given!r}")
    named.sort(key=lambda c: (c.revoked_at is None, c.created_at), reverse=True)
    return named[0].id


def usage(
    ctx: typer.Context,
    since: Annotated[
        str | None, typer.Option(help="from (ISO 8601, or a span before now: 90m, 6h, 7d)")
    ] = None,
    until: Annotated[str | None, typer.Option(help="to (ISO 8601 or a span); default now")] = None,
    client: Annotated[
        str | None, typer.Option(help="one service client (its id or its name)")
    ] = None,
    model: Annotated[str | None, typer.Option(help="one served model")] = None,
    step: Annotated[
        UsageStep | None, typer.Option(help="a row per client and model per this (default hour)")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="rows at most")] = 1000,
    csv_file: Annotated[
        Path | None, typer.Option("--csv", help="also write the rows to this CSV file")
    ] = None,
    json: JsonOption = False,
    fmt: Annotated[
        UsageFormat | None,
        typer.Option(
            "--output",
            "-o",
            help="table, wide (errors by code, ISO times), json (the API's answer), csv",
        ),
    ] = None,
) -> None:
    """The gateway's usage per service client and model: requests, errors, tokens, TTFT.

    The default range is the last 24 hours by the hour (a day's steps: `--step day
    --since 7d`). Errors count every invoke that did not succeed, by its code in `-o
    wide`; the totals line covers the whole range and filters."""
    now = datetime.now(UTC)
    form = UsageFormat.JSON if json else (fmt or UsageFormat.TABLE)

    def call(c: AdminClient) -> UsageReport:
        params = {
            "since": _param(instant(since, now)),
            "until": _param(instant(until, now)),
            "client": client_id(c, client) if client is not None else None,
            "model": model,
            "step": step,
            "limit": limit,
        }
        return c.call(UsageReport, "GET", USAGE, params=params)

    report = answer(ctx, call)
    if csv_file is not None:
        try:
            with csv_file.open("w", newline="") as sink:
                write_csv(report, sink)
        except OSError as exc:
            raise AdminFailure(f"{csv_file}: {exc.strerror}") from None
        output(Format.JSON).note(f"wrote {len(report.rows)} rows to {csv_file}")
    if form is UsageFormat.CSV:
        write_csv(report, sys.stdout)
        return
    out = output(Format(form.value))
    out.table(report, report.rows, USAGE_COLUMNS)
    if out.json_mode:
        return
    totals = report.totals
    errors = sum(totals.errors.values())
    out.line(
        f"total {totals.requests} requests, {errors} errors, {totals.prompt_tokens} tokens in, "
        f"{totals.completion_tokens} out, TTFT p50 {_ms(totals.ttft_p50_s) or '-'} "
        f"p99 {_ms(totals.ttft_p99_s) or '-'}"
    )
    if errors:
        out.line(f"errors by code: {_by_code(totals.errors)}")
    out.line(f"from {iso(report.since)} to {iso(report.until)}, by the {report.step.value}")
    if report.truncated:
        out.note(
            f"more rows than --limit {limit}: narrow the range or the filters, or a coarser --step",
            style="yellow",
        )


def _param(at: datetime | None) -> str | None:
    return None if at is None else at.astimezone(UTC).isoformat()


def text_cell(value: str) -> str:
    """A name for a spreadsheet's cell: read as the text it is, never as a formula."""
    return f"'{value}" if value.startswith(FORMULA_STARTS) else value


def write_csv(report: UsageReport, sink: TextIO) -> None:
    """The rows, a line each, with a header; instants ISO 8601, seconds as numbers; a
    name (client, model) that a spreadsheet would take for a formula as text."""
    writer = csv.writer(sink)
    writer.writerow(CSV_FIELDS)
    for row in report.rows:
        writer.writerow(
            [
                iso(row.start),
                row.client_id,
                text_cell(row.client_name or ""),
                text_cell(row.model),
                row.requests,
                _errors(row),
                ";".join(f"{code}={count}" for code, count in sorted(row.errors.items())),
                row.prompt_tokens,
                row.completion_tokens,
                row.ttft_count,
                "" if row.ttft_p50_s is None else row.ttft_p50_s,
                "" if row.ttft_p99_s is None else row.ttft_p99_s,
            ]
        )
