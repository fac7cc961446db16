"""`modelforge admin usage` against a real API whose rollup holds what the gateway's
flush writes (store.rollup.usage.add, as api/gateway/usage.py calls it): the table fits
an 80-column terminal, --json and -o json are the API's report, CSV (on stdout or to a
file) has a row per bucket/client/model with the same sums, and the filters (a client by
name, a model, a step) reach the API. `service-clients create --max-tokens-per-day`
sends the budget and the list shows it."""

from __future__ import annotations

import csv
import io
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console

from cli.admin.output import Format, Output
from cli.admin.usage import USAGE_COLUMNS, write_csv
from schemas.protocol import SERVICE_CLIENTS
from schemas.service_clients import ServiceClientCreated, ServiceClientView
from schemas.usage import UsageReport, UsageRow, UsageStep, UsageTotals
from store.rollup.usage import UsageDelta
from tests.api_server import RunningApi
from tests.cli_support import Admin, failed, ok
from tests.rollup_flows import ttft_counts, usage_delta, write_usage

pytest_plugins = ["tests.cli_fixtures"]

SGR = re.compile(r"\x1b\[[0-9;]*m")
PLANNER = "the-planner-service-with-a-long-name"
MODEL = "smol-chat-model-with-a-long-served-name"


def delta(
    minute: datetime, client: uuid.UUID, model: str, outcome: str, requests: int, ttft_s: float
) -> UsageDelta:
    completion = 20 if outcome == "ok" else 0
    return usage_delta(
        minute, client, model, outcome, requests, ttft_counts(ttft_s, requests),
        completion_each=completion,
    )  # fmt: skip


def metered(api: RunningApi) -> tuple[uuid.UUID, uuid.UUID]:
    """Two service clients; what the gateway would have flushed for them this hour and
    two hours ago."""
    with api.client() as client:
        ids = []
        for name in (PLANNER, "batch"):
            answer = client.post(
                SERVICE_CLIENTS, json={"name": name, "models": [MODEL]}, headers=api.admin_headers
            )
            assert answer.status_code == 201, answer.text
            ids.append(uuid.UUID(answer.json()["id"]))
    planner, batch = ids
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    deltas = [
        delta(now, planner, MODEL, "ok", 8, 0.3),
        delta(now, planner, MODEL, "rate_limited", 2, 0.01),
        delta(now - timedelta(hours=2), planner, MODEL, "ok", 5, 0.6),
        delta(now, batch, "other-model", "ok", 3, 1.2),
        delta(now, batch, "other-model", "budget_exhausted", 1, 0.01),
    ]
    write_usage(api.settings.database_url, deltas)
    return planner, batch


def test_usage_table_json_csv_and_filters(
    admin: Admin, tty_admin: Admin, api: RunningApi, tmp_path: Path
) -> None:
    planner, batch = metered(api)
    report = UsageReport.model_validate_json(ok(admin("usage", "--json")))
    assert report.totals.requests == 19 and report.totals.prompt_tokens == 190
    assert report.totals.errors == {"rate_limited": 2, "budget_exhausted": 1}
    again = UsageReport.model_validate_json(ok(admin("usage", "-o", "json")))
    # The same report (its range ends at each call's now).
    assert (again.rows, again.totals) == (report.rows, report.totals)
    assert {(r.client_id, r.model) for r in report.rows} == {
        (planner, MODEL),
        (batch, "other-model"),
    }

    table = SGR.sub("", ok(tty_admin("usage", columns=80))).splitlines()
    assert all(cell_len(line) <= 80 for line in table), table
    header = next(i for i, line in enumerate(table) if line.startswith("START"))
    rows = table[header + 1 : header + 1 + len(report.rows)]
    assert all("ago" in row for row in rows), rows
    assert any(line.startswith("total ") and "19 requests" in line for line in table)
    # Times to first token in ms, as `admin overview` and the dashboard show them.
    totals = next(line for line in table if line.startswith("total "))
    assert re.search(r"TTFT p50 \d+ ms p99 \d+ ms", totals), totals
    assert all(re.search(r" \d+ ms\b", row) for row in rows), rows  # p99 gives way at 80
    assert "errors by code: budget_exhausted=1,rate_limited=2" in table
    wide = ok(admin("usage", "-o", "wide"))
    assert "rate_limited=2" in wide and str(planner) in wide and PLANNER in wide

    parsed = list(csv.DictReader(io.StringIO(ok(admin("usage", "-o", "csv")))))
    assert len(parsed) == len(report.rows)
    assert sum(int(r["requests"]) for r in parsed) == 19
    assert sum(int(r["errors"]) for r in parsed) == 3
    assert {r["client_name"] for r in parsed} == {PLANNER, "batch"}
    target = tmp_path / "usage.csv"
    result = admin("usage", "--csv", str(target))
    assert f"wrote {len(report.rows)} rows to {target}" in result.stderr
    assert "START" in ok(result)
    assert list(csv.DictReader(target.open())) == parsed

    mine = UsageReport.model_validate_json(ok(admin("usage", "--client", PLANNER, "--json")))
    assert {r.client_id for r in mine.rows} == {planner} and mine.totals.requests == 15
    daily = UsageReport.model_validate_json(
        ok(admin("usage", "--step", "day", "--model", "other-model", "--since", "2d", "--json"))
    )
    assert daily.step.value == "day" and daily.totals.requests == 4
    recent = UsageReport.model_validate_json(ok(admin("usage", "--since", "90m", "--json")))
    assert recent.totals.requests == 14, "the bucket two hours ago is left out"
    refused = admin("usage", "--since", "yesterday")
    assert refused.returncode == 2 and "ISO 8601" in refused.stderr
    # The API's 422 names what to change, not only "does not match the schema".
    too_long = failed(admin("usage", "--since", "2d", "--step", "minute"), "validation_failed")
    assert ": since: " in too_long.string and "step=minute" in too_long.string


def test_a_service_client_with_a_daily_token_budget(admin: Admin, api: RunningApi) -> None:
    created = ServiceClientCreated.model_validate_json(
        ok(
            admin(
                "service-clients",
                "create",
                "budgeted",
                "--model",
                MODEL,
                "--max-tokens-per-day",
                "50000",
                "--json",
            )
        )
    )
    assert created.max_tokens_per_day == 50000
    shown = ok(admin("service-clients", "get", str(created.id)))
    assert re.search(r"^Max Tokens Per Day:\s+50000\s*$", shown, re.M), shown
    listed = ok(admin("service-clients", "list"))
    assert "TOKENS/DAY" in listed and "50000" in listed
    view = ServiceClientView.model_validate_json(
        ok(admin("service-clients", "get", str(created.id), "--json"))
    )
    assert view.max_tokens_per_day == 50000


def report_of(*rows: UsageRow) -> UsageReport:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    counts = {"errors": {}, "ttft_count": 0, "ttft_p50_s": None, "ttft_p99_s": None}
    totals = UsageTotals(requests=0, prompt_tokens=0, completion_tokens=0, **counts)
    return UsageReport(
        since=now - timedelta(hours=1), until=now, step=UsageStep.HOUR, rows=list(rows),
        totals=totals, truncated=False,
    )  # fmt: skip


def usage_row(client_name: str, model: str = MODEL) -> UsageRow:
    return UsageRow(
        start=datetime.now(UTC), client_id=uuid.uuid4(), client_name=client_name, model=model,
        requests=1, errors={}, prompt_tokens=1, completion_tokens=1, ttft_count=0,
        ttft_p50_s=None, ttft_p99_s=None,
    )  # fmt: skip


@pytest.mark.fast
def test_a_csv_cell_is_never_a_formula() -> None:
    """A client's name (or a model) that a spreadsheet would run as a formula is written
    after a single quote, as OWASP's CSV injection advice says; other names as they are."""
    hostile = ['=HYPERLINK("http://evil.example","x")', "+1+1", "-2+3", "@SUM(A1)", "\tx"]
    rows = [usage_row(name, model=name) for name in hostile] + [usage_row("plain")]
    sink = io.StringIO()
    write_csv(report_of(*rows), sink)
    parsed = list(csv.DictReader(io.StringIO(sink.getvalue())))
    assert [r["client_name"] for r in parsed] == [f"'{name}" for name in hostile] + ["plain"]
    assert [r["model"] for r in parsed] == [f"'{name}" for name in hostile] + [MODEL]


@pytest.mark.fast
def test_a_control_character_in_a_client_name_is_spelled_not_sent() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, color_system="truecolor", width=200)
    name = "evil\x1b[2J\x1b]8;;https://evil.example/\x07name\u202e"
    Output(Format.TABLE, console=console).rows([usage_row(name)], USAGE_COLUMNS)
    shown = SGR.sub("", buffer.getvalue())
    assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown, repr(shown)
    assert "evil\\x1b[2J\\x1b]8;;https://evil.example/\\x07name\\u202e" in shown
