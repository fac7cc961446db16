"""The overview routes (api/admin/overview.py) against the real API and PostgreSQL: the
fleet now (nodes by liveness, GPUs of the serving nodes, services by health) and the
gateway's last complete minute from the usage rollup; the history (every step present,
the fleet's figures where a row was written, rates from usage); a node's telemetry
history (404 for an unknown node); and the cost of the overview at 10,000 nodes."""

from __future__ import annotations

import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.admin.overview import last_minute
from schemas.overview import (
    NODE_HISTORY,
    OVERVIEW,
    OVERVIEW_HISTORY,
    NodeHistory,
    OverviewHistory,
    OverviewNow,
)
from store.rollup import fleet, nodes, usage
from store.rollup.usage import UsageDelta
from tests.admin_helpers import ok, refused
from tests.api_server import ApiFactory, RunningApi
from tests.deployment_flows import ready_deployment
from tests.rollup_flows import (
    expected,
    node_id,
    seed_fleet,
    seed_services,
    ttft_counts,
    usage_delta,
)

NODES = 200
TAG = "o"


@pytest.fixture
def api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(pipeline=False)


async def database_minute(sessions: async_sessionmaker[AsyncSession]) -> datetime:
    async with sessions() as session:
        now: datetime = (await session.execute(select(func.statement_timestamp()))).scalar_one()
    return now.astimezone(UTC).replace(second=0, microsecond=0)


def invokes(minute: datetime, outcome: str, requests: int, ttft_s: float | None) -> UsageDelta:
    ttft = None if ttft_s is None else ttft_counts(ttft_s, requests)
    return usage_delta(minute, uuid.UUID(int=1), "smol", outcome, requests, ttft,
                       prompt_each=6, completion_each=60)  # fmt: skip


def get(http: httpx.Client, api: RunningApi, path: str, **params: str) -> httpx.Response:
    return http.get(path, params=params, headers=api.admin_headers)


async def test_the_fleet_now_and_the_gateways_last_minute(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    await seed_fleet(sessions, NODES, TAG)
    services = await seed_services(sessions, TAG, [5, 6, 7, 8, 9, 12])
    minute = await database_minute(sessions)
    # The same invokes in this minute and the two before: whichever is the last
    # complete minute when the request comes, it holds them.
    async with sessions() as session, session.begin():
        for at in (minute - timedelta(minutes=2), minute - timedelta(minutes=1), minute):
            await usage.add(
                session, [invokes(at, "ok", 120, 0.4), invokes(at, "rate_limited", 30, None)]
            )
    with api.client() as http:
        now = OverviewNow.model_validate(ok(get(http, api, OVERVIEW)))
    want = expected(NODES)
    assert (
        now.nodes == want.nodes
        and now.services == services
        and set(now.deployments.values()) == {0}
    )
    assert now.gpus.count == want.gpus
    assert now.gpus.memory_used_bytes == want.gpu_memory_used_bytes
    assert now.gpus.memory_free_bytes == want.gpu_memory_total_bytes - want.gpu_memory_used_bytes
    gateway = now.gateway
    assert gateway.window_s == 60
    assert gateway.window_start == last_minute(
        now.at, api.state.settings.gateway_measure_interval_s
    )
    assert gateway.requests_per_s == pytest.approx(150 / 60)
    assert gateway.errors_per_s == pytest.approx(30 / 60)
    assert gateway.errors == {"rate_limited": pytest.approx(0.5)}
    assert gateway.tokens_per_s == pytest.approx(150 * 66 / 60)
    assert gateway.completion_tokens_per_s == pytest.approx(150 * 60 / 60)
    assert gateway.ttft_p50_s is not None and 0.25 < gateway.ttft_p50_s <= 0.5


@pytest.mark.fast
def test_the_gateways_last_minute_is_one_every_process_has_flushed() -> None:
    # Flushed every 5 s: a minute is complete 5 s (and a flush's grace, 2 s) after it.
    assert last_minute(datetime(2026, 1, 5, 10, 0, 6, tzinfo=UTC), 5) == datetime(
        2026, 1, 5, 9, 58, tzinfo=UTC
    )
    assert last_minute(datetime(2026, 1, 5, 10, 0, 8, tzinfo=UTC), 5) == datetime(
        2026, 1, 5, 9, 59, tzinfo=UTC
    )


async def test_the_history_has_every_step_with_what_was_written(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    await seed_fleet(sessions, 10, TAG)
    async with sessions() as session, session.begin():
        written = await fleet.record(session)
    minute = await database_minute(sessions)
    async with sessions() as session, session.begin():
        await usage.add(session, [invokes(minute - timedelta(minutes=12), "ok", 60, 1.2)])
        # The fleet row of an earlier minute too (as a worker wrote it then).
        await session.execute(
            text(
                "INSERT INTO fleet_minutes SELECT minute - interval '10 minutes', nodes, gpus,"
                " gpu_memory_total_bytes, gpu_memory_used_bytes, gpu_utilization_percent,"
                " deployments, services FROM fleet_minutes"
            )
        )
    with api.client() as http:
        hour = OverviewHistory.model_validate(ok(get(http, api, OVERVIEW_HISTORY, range="1h")))
        day = OverviewHistory.model_validate(ok(get(http, api, OVERVIEW_HISTORY, range="24h")))
        refused(get(http, api, OVERVIEW_HISTORY, range="7d"), 422, "validation_failed")
    assert hour.step_s == 60 and len(hour.points) == 60
    assert day.step_s == 300 and len(day.points) == 288
    starts = [point.start for point in hour.points]
    assert starts == sorted(starts) and hour.until - hour.since == timedelta(hours=1)
    assert starts[-1] + timedelta(minutes=1) == hour.until
    by_start = {point.start: point for point in hour.points}
    earlier = by_start.get(written - timedelta(minutes=10))
    if earlier is not None:  # None only when the minute turned between write and read
        assert earlier.gpus is not None and earlier.gpus.count == expected(10).gpus
        assert earlier.nodes == expected(10).nodes
    assert sum(1 for point in hour.points if point.nodes is not None) <= 2
    invoked = by_start.get(minute - timedelta(minutes=12))
    assert invoked is not None and invoked.requests_per_s == pytest.approx(1.0)
    assert invoked.tokens_per_s == pytest.approx(66.0)
    assert invoked.ttft_p50_s is not None and 1.0 < invoked.ttft_p50_s <= 1.5
    assert sum(point.requests_per_s for point in hour.points) == pytest.approx(1.0)
    # A day's five-minute steps average the same invokes over 300 s.
    assert sum(point.requests_per_s for point in day.points) == pytest.approx(60 / 300)


async def test_a_nodes_history_from_its_minutes(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    await seed_fleet(sessions, 3, TAG)
    one = node_id(TAG, 1)
    async with sessions() as session, session.begin():
        await nodes.record(session)
        await session.execute(
            text(
                "INSERT INTO node_minutes (node_id, minute, ram_used_bytes)"
                " VALUES (:node, date_trunc('minute', now()) - interval '30 minutes', 7)"
            ),
            {"node": one},
        )
    path = NODE_HISTORY.format(node_id=one)
    with api.client() as http:
        history = NodeHistory.model_validate(ok(get(http, api, path, range="1h")))
        refused(get(http, api, NODE_HISTORY.format(node_id=uuid.uuid4())), 404, "not_found")
        refused(get(http, api, NODE_HISTORY.format(node_id="nope")), 422, "validation_failed")
        refused(http.get(path), 401, "admin_token_missing")
    assert history.node_id == one and len(history.points) == 60
    filled = [point for point in history.points if point.ram_used_bytes is not None]
    assert [point.ram_used_bytes for point in filled] == [7, 1 << 30]
    # The current minute is the last point: the panel's latest sample.
    latest = filled[-1]
    assert latest.start == history.points[-1].start or latest.start == history.points[-2].start
    assert latest.gpu_utilization_percent == pytest.approx(25.5)
    assert latest.gpu_utilization_max_percent == 50 and latest.gpu_memory_used_bytes == 2 << 30


def test_a_deployment_and_its_node_counted_as_the_api_left_them(api: RunningApi) -> None:
    with api.client() as http:
        ready_deployment(http, api)
        now = OverviewNow.model_validate(ok(get(http, api, OVERVIEW)))
    assert now.deployments["ready"] == 1 and sum(now.deployments.values()) == 1
    assert now.nodes["online"] == 1 and sum(now.nodes.values()) == 1


@pytest.mark.slow
async def test_the_overview_at_ten_thousand_nodes(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """The figure for the README: GET /overview over 10,000 nodes (20,000 GPUs, their
    telemetry), the median of 7 requests; and the worker's minute at that size."""
    count = 10_000
    started = time.perf_counter()
    await seed_fleet(sessions, count, "big")
    seeded_s = time.perf_counter() - started
    timings = []
    with api.client() as http:
        ok(get(http, api, OVERVIEW))  # warm: the connection, the plans
        for _ in range(7):
            started = time.perf_counter()
            now = OverviewNow.model_validate(ok(get(http, api, OVERVIEW)))
            timings.append(time.perf_counter() - started)
    assert now.nodes == expected(count).nodes and now.gpus.count == expected(count).gpus
    started = time.perf_counter()
    async with sessions() as session, session.begin():
        await fleet.record(session)
    fleet_s = time.perf_counter() - started
    started = time.perf_counter()
    async with sessions() as session, session.begin():
        copied = await nodes.record(session)
    nodes_s = time.perf_counter() - started
    assert copied == count
    median = statistics.median(timings)
    print(
        f"\noverview at {count} nodes: GET median {median * 1000:.0f} ms"
        f" (min {min(timings) * 1000:.0f}, max {max(timings) * 1000:.0f});"
        f" fleet minute {fleet_s * 1000:.0f} ms; node minutes {nodes_s * 1000:.0f} ms;"
        f" seeded in {seeded_s:.1f} s"
    )
    # Generous for a shared CI box; the figure itself is what the README reports.
    assert median < 2.0
