"""GET /api/v1/admin/usage (api/admin/usage.py) against the real API and PostgreSQL,
usage written as the gateway writes it (store/rollup/usage.py: add): rows per step,
client (with its name) and model, errors by code, time to first token from the summed
buckets, totals of the whole range; the filters and the limit; refusals (422 for a range
that is empty, reversed or too long for its step, or a bad parameter; 401 without the
operator key)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.usage import TTFT_BUCKETS_S, USAGE, UsageReport
from store.rollup import usage
from tests.admin_helpers import ok, refused
from tests.api_server import ApiFactory, RunningApi
from tests.deployment_flows import created_service_client
from tests.rollup_flows import ttft_counts, usage_delta

# An hour boundary well in the past, so nothing else writes there.
HOUR = datetime(2026, 1, 5, 10, tzinfo=UTC)


def get(http: httpx.Client, api: RunningApi, **params: Any) -> httpx.Response:
    return http.get(USAGE, params=params, headers=api.admin_headers)


def report(http: httpx.Client, api: RunningApi, **params: Any) -> UsageReport:
    return UsageReport.model_validate(ok(get(http, api, **params)))


@pytest.fixture
def api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(pipeline=False)


async def test_rows_per_step_client_and_model_with_errors_ttft_and_totals(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    with api.client() as client:
        alice = uuid.UUID(created_service_client(client, api, name="alice")["id"])
        bob = uuid.UUID(created_service_client(client, api, name="bob")["id"])
    async with sessions() as session, session.begin():
        await usage.add(
            session,
            [
                usage_delta(HOUR, alice, "smol", requests=90, ttft=ttft_counts(0.3, 90)),
                usage_delta(
                    HOUR + timedelta(minutes=30),
                    alice,
                    "smol",
                    requests=10,
                    ttft=ttft_counts(4.0, 10),
                ),
                usage_delta(HOUR + timedelta(minutes=5), alice, "smol", "rate_limited", 3),
                usage_delta(HOUR + timedelta(minutes=6), alice, "smol", "upstream_failed", 2),
                usage_delta(HOUR + timedelta(hours=1), alice, "smol", requests=4),
                usage_delta(HOUR, bob, "big", requests=7),
                usage_delta(HOUR, bob, "big", "budget_exhausted", 5),
            ],
        )
    since, until = HOUR.isoformat(), (HOUR + timedelta(hours=2)).isoformat()
    with api.client() as client:
        hourly = report(client, api, since=since, until=until, step="hour")
        only_alice = report(client, api, since=since, until=until, client=str(alice))
        only_big = report(client, api, since=since, until=until, model="big", step="day")
        minutes = report(client, api, since=since, until=until, step="minute", limit=3)
    assert [(r.start, r.client_name, r.model, r.requests) for r in hourly.rows] == sorted(
        [
            (HOUR, "alice", "smol", 105),
            (HOUR, "bob", "big", 12),
            (HOUR + timedelta(hours=1), "alice", "smol", 4),
        ],
        key=lambda r: (r[0], {"alice": alice, "bob": bob}[str(r[1])]),
    )
    first = next(r for r in hourly.rows if r.client_id == alice and r.start == HOUR)
    assert first.errors == {"rate_limited": 3, "upstream_failed": 2}
    assert (first.prompt_tokens, first.completion_tokens, first.ttft_count) == (1050, 10500, 100)
    # 90 of 100 between 0.25 and 0.5 s, 10 between 3 and 5 s.
    assert first.ttft_p50_s is not None and 0.25 < first.ttft_p50_s <= 0.5
    assert first.ttft_p99_s is not None and 3.0 < first.ttft_p99_s <= 5.0
    totals = hourly.totals
    assert totals.requests == 121 and totals.ttft_count == 100
    assert totals.errors == {"rate_limited": 3, "upstream_failed": 2, "budget_exhausted": 5}
    assert totals.ttft_p50_s == first.ttft_p50_s
    assert not hourly.truncated and hourly.step == "hour"

    assert {r.client_id for r in only_alice.rows} == {alice} and only_alice.totals.requests == 109
    assert [(r.start, r.requests) for r in only_big.rows] == [(HOUR.replace(hour=0), 12)]
    assert only_big.rows[0].errors == {"budget_exhausted": 5}
    # Five minutes with invokes of alice, one of bob: the first three rows, and the totals
    # of the whole range still.
    assert minutes.truncated and len(minutes.rows) == 3
    assert [r.start for r in minutes.rows] == [HOUR, HOUR, HOUR + timedelta(minutes=5)]
    assert minutes.totals.requests == 121


async def test_the_range_defaults_to_the_last_span_before_now(api: RunningApi) -> None:
    with api.client() as client:
        found = report(client, api, step="minute")
    assert found.until - found.since == timedelta(hours=1)
    assert abs(found.until - datetime.now(UTC)) < timedelta(minutes=1)
    assert found.rows == [] and found.totals.requests == 0
    assert found.totals.ttft_p50_s is None and len(TTFT_BUCKETS_S) > 1


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"since": "2026-01-05T10:00:00Z", "until": "2026-01-05T10:00:00Z"}, "since"),
        ({"since": "2026-01-05T11:00:00Z", "until": "2026-01-05T10:00:00Z"}, "since"),
        ({"since": "2026-01-01T00:00:00Z", "until": "2026-01-05T00:00:00Z", "step": "minute"},
         "since"),
        ({"since": "2020-01-01T00:00:00Z", "until": "2026-01-05T00:00:00Z", "step": "day"},
         "since"),
        ({"until": "0001-01-02T12:00:00Z", "step": "day"}, "until"),  # since: before year 1
        ({"step": "week"}, "step"),
        ({"limit": "0"}, "limit"),
        ({"limit": "10001"}, "limit"),
        ({"client": "not-a-uuid"}, "client"),
        ({"since": "yesterday"}, "since"),
        ({"since": "2026-01-05T10:00:00"}, "since"),  # no offset
        ({"model": ""}, "model"),
    ],
)  # fmt: skip
def test_bad_parameters_are_refused_422_naming_the_parameter(
    api: RunningApi, params: dict[str, str], field: str
) -> None:
    with api.client() as client:
        body = refused(get(client, api, **params), 422, "validation_failed")
    assert [detail["location"] for detail in body["details"]] == [["query", field]], body


def test_the_operator_key_is_required(api: RunningApi) -> None:
    with api.client() as client:
        refused(client.get(USAGE), 401, "admin_token_missing")
        refused(client.get(USAGE, headers={"X-ModelForge-Admin-Token": "wrong"}), 401,
                "admin_token_invalid")  # fmt: skip
