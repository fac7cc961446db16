"""The gateway's measurements per served model (api/gateway/measurements.py, store/
services/measurements.py) against the real API and PostgreSQL, the test speaking for
the deployment's node over the protocol: streams relayed through the gateway show in
its row (in flight while unanswered, the time to first token of a node that answers
slowly), two API processes' rows add up and a stopped one's go, a stale row stops
counting and is pruned; and the window a flush writes (failures, an idle model written
once more, times to first token older than the window dropped)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.gateway.measurements import TTFT_WINDOW_S, GatewayMeasurements
from store.services import measurements
from store.services.measurements import GatewayMeasurement, Measured, Window
from tests.api_server import ApiFactory, RunningApi
from tests.deployment_flows import (
    DeployedNode,
    HeldChannel,
    answer_invoke,
    ready_deployment,
    runtime_channel,
    service_client,
)
from tests.measurement_flows import CHUNKS, measured, stream, until

# The node's prefill, as the test plays it: its first chunk comes this late.
PREFILL_S = 0.5
INTERVAL_S = 0.2
STALE_S = measurements.FRESH_S + 1


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(6) as executor:
        yield executor


def gateway(api_factory: ApiFactory) -> RunningApi:
    return api_factory(gateway_first_token_timeout_s=10, gateway_measure_interval_s=INTERVAL_S)


def slowly() -> Iterator[bytes]:
    time.sleep(PREFILL_S)  # the node's prefill: what the time to first token measures
    yield from CHUNKS


def answer(api: RunningApi, node: DeployedNode, invoke: dict[str, Any]) -> None:
    sent = answer_invoke(api, node.node, invoke, slowly(), content_type="text/event-stream")
    assert sent.status_code == 200, sent.text


async def next_invoke(channel: HeldChannel) -> dict[str, Any]:
    return await asyncio.to_thread(channel.next_invoke)


async def test_streams_relayed_show_in_flight_then_their_time_to_first_token(
    api_factory: ApiFactory,
    sessions: async_sessionmaker[AsyncSession],
    pool: ThreadPoolExecutor,
) -> None:
    api = gateway(api_factory)
    with api.client() as client:
        deployed = ready_deployment(client, api)
        secret = service_client(client, api)
    with runtime_channel(api, deployed.node) as channel:
        calls: list[Future[float]] = [pool.submit(stream, api, secret)]
        invokes = [await next_invoke(channel)]

        # The model's first row is the window its first invoke began in.
        async def written() -> Measured | None:
            now = await measured(sessions)
            return now if now.rows else None

        first = await until(written, "the model's first row")
        assert (first.rows, first.in_flight, first.started, first.errors) == (1, 1, 1, 0)
        assert first.ttft_count == 0 and first.ttft_p90_s is None
        calls.append(pool.submit(stream, api, secret))
        invokes.append(await next_invoke(channel))

        async def both() -> Measured | None:
            now = await measured(sessions)
            return now if now.in_flight == 2 else None

        await until(both, "two streams in flight, neither answered")
        answers = [pool.submit(answer, api, deployed, invoke) for invoke in invokes]
        for done in answers:
            done.result(20)
        seen = [call.result(20) for call in calls]

    async def answered() -> Measured | None:
        now = await measured(sessions)
        return now if now.in_flight == 0 and now.ttft_count == 2 else None

    after = await until(answered, "both streams ended, their times to first token written")
    assert after.rows == 1 and after.errors == 0
    # From the gateway's arrival to the first chunk: at least the node's prefill, at most
    # what the slower client saw from sending to its first line.
    assert after.ttft_p90_s is not None
    assert PREFILL_S <= after.ttft_p90_s <= max(seen), (after, seen)


async def test_two_api_processes_add_up_and_a_stopped_one_no_longer_counts(
    api_factory: ApiFactory,
    sessions: async_sessionmaker[AsyncSession],
    pool: ThreadPoolExecutor,
) -> None:
    one, two = gateway(api_factory), gateway(api_factory)
    with one.client() as client:
        deployed = ready_deployment(client, one)
        secret = service_client(client, one)
    # The node's channel is held on the first; the second's invoke reaches it over NATS.
    with runtime_channel(one, deployed.node) as channel:
        calls = [pool.submit(stream, api, secret) for api in (one, two)]
        invokes = [await next_invoke(channel), await next_invoke(channel)]

        async def both() -> Measured | None:
            now = await measured(sessions)
            return now if (now.rows, now.in_flight) == (2, 2) else None

        await until(both, "one stream in flight on each API process, two rows")
        by_gateway = {one.state.invokes.id: one, two.state.invokes.id: two}
        answers = [
            pool.submit(answer, by_gateway[invoke["gateway"]], deployed, invoke)
            for invoke in invokes
        ]
        for done in answers:
            done.result(20)
        for call in calls:
            assert call.result(20) >= PREFILL_S

    async def answered() -> Measured | None:
        now = await measured(sessions)
        return now if now.in_flight == 0 and now.ttft_count == 2 else None

    await until(answered, "both ended, one time to first token from each process")
    await asyncio.to_thread(two.stop)
    after = await measured(sessions)
    assert after.rows == 1 and after.ttft_count == 1


async def test_a_stale_row_stops_counting_and_is_pruned(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    def window(in_flight: int, p90: float) -> Window:
        return Window(model="smol", window_s=5.0, in_flight=in_flight, started=in_flight,
                      errors=0, ttft_count=10, ttft_p50_s=p90 / 2, ttft_p90_s=p90)  # fmt: skip

    async with sessions() as session, session.begin():
        await measurements.write(session, "live", [window(2, 1.0)])
        await measurements.write(session, "dead", [window(40, 9.0)])
    assert (await measured(sessions)).in_flight == 42
    async with sessions() as session, session.begin():
        await session.execute(
            update(GatewayMeasurement)
            .where(GatewayMeasurement.instance == "dead")
            .values(window_end=GatewayMeasurement.window_end - timedelta(seconds=STALE_S))
        )
    fresh = await measured(sessions)
    assert (fresh.rows, fresh.in_flight, fresh.ttft_count, fresh.ttft_p90_s) == (1, 2, 10, 1.0)
    # An overwrite keeps one row per (model, process).
    async with sessions() as session, session.begin():
        await measurements.write(session, "live", [window(3, 2.0)])
    assert (await measured(sessions)).in_flight == 3
    async with sessions() as session, session.begin():
        pruned = await measurements.prune(session, older_than_s=measurements.FRESH_S)
    assert pruned == 1
    async with sessions() as session:
        left = await measurements.read(session, "smol", fresh_s=86_400)
    assert left.rows == 1


@pytest.mark.fast
def test_a_window_counts_failures_writes_an_idle_model_once_and_drops_old_times() -> None:
    """The window itself (no database: it is what each flush writes)."""
    measured = GatewayMeasurements(None, "api-1", INTERVAL_S)  # type: ignore[arg-type]
    measured.began("smol")
    measured.failed("smol")
    measured.ended("smol")
    for seconds in (0.1, 0.2, 0.3, 0.4, 1.0):
        measured.began("big")
        measured.first_token("big", seconds)
    [big, smol] = measured.window()
    assert (smol.model, smol.in_flight, smol.started, smol.errors) == ("smol", 0, 1, 1)
    assert smol.ttft_count == 0 and smol.ttft_p90_s is None
    assert (big.model, big.in_flight, big.started, big.errors) == ("big", 5, 5, 0)
    assert (big.ttft_count, big.ttft_p50_s, big.ttft_p90_s) == (5, 0.3, 1.0)
    # Idle since: written once more (its in flight reads 0 at once), then no more.
    [big, smol] = measured.window()
    assert (smol.started, smol.errors, smol.in_flight) == (0, 0, 0)
    assert (big.started, big.in_flight, big.ttft_count) == (0, 5, 5)
    [big] = measured.window()
    assert big.model == "big"
    # Times older than the window no longer count; the streams still in flight do.
    samples = measured._ttft["big"]
    old = [(at - TTFT_WINDOW_S - 1, seconds) for at, seconds in samples]
    samples.clear()
    samples.extend(old)
    [big] = measured.window()
    assert (big.in_flight, big.ttft_count, big.ttft_p90_s) == (5, 0, None)
    for _ in range(5):
        measured.ended("big")
    assert [w.in_flight for w in measured.window()] == [0]
    assert measured.window() == []
