"""Autoscale on the gateway's own measurements (store/services/reconcile.py: _autoscale,
store/services/measurements.py) against the real API and PostgreSQL, the test speaking
for the nodes and writing the API processes' measurement rows as they do: up when the
time to first token is over its target, held between half and the target (hysteresis)
and within the cooldown, down once it and the queue are below half, the gateway's in
flight summed over API processes, and a stale row counting for nothing; and end to end,
streams waiting at a real API's gateway scaling the service up through its own row."""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.services import Autoscale
from store.models import OutboxEvent
from store.services import measurements
from store.services.measurements import GatewayMeasurement, Window
from tests.api_server import ApiFactory, RunningApi
from tests.deployment_flows import answer_invoke, runtime_channel, service_client
from tests.measurement_flows import CHUNKS, measured, stream, until
from tests.service_flows import (
    change,
    fleet_serving,
    made_ready,
    on,
    phases,
    replicas,
    service_api,
    service_row,
    step,
)

# The fixture `api` these tests run on.
from tests.service_flows import ready_api as ready_api


async def gateway_says(
    sessions: async_sessionmaker[AsyncSession],
    instance: str,
    *,
    in_flight: int = 0,
    ttft_p90_s: float | None = None,
) -> None:
    """An API process's row for the service's name, as its flush writes it."""
    count = 20 if ttft_p90_s is not None else 0
    window = Window(model="smol", window_s=5.0, in_flight=in_flight, started=count, errors=0,
                    ttft_count=count, ttft_p50_s=ttft_p90_s, ttft_p90_s=ttft_p90_s)  # fmt: skip
    async with sessions() as session, session.begin():
        await measurements.write(session, instance, [window])


async def stale(sessions: async_sessionmaker[AsyncSession], instance: str) -> None:
    """The process stopped writing past the read side's bound."""
    async with sessions() as session, session.begin():
        await session.execute(
            update(GatewayMeasurement)
            .where(GatewayMeasurement.instance == instance)
            .values(
                window_end=GatewayMeasurement.window_end
                - timedelta(seconds=measurements.FRESH_S + 1)
            )
        )


async def autoscaled(sessions: async_sessionmaker[AsyncSession]) -> list[dict[str, Any]]:
    async with sessions() as session:
        rows = await session.execute(
            select(OutboxEvent.envelope)
            .where(
                OutboxEvent.envelope["action"].astext == "service.changed",
                OutboxEvent.envelope["data"]["action"].astext == "autoscaled",
            )
            .order_by(OutboxEvent.position)
        )
        return [dict(row) for row in rows.scalars()]


async def sweep(sessions: async_sessionmaker[AsyncSession], service_id: uuid.UUID) -> int:
    """One pass of the workers' sweeps; the service's desired count after it."""
    await step(sessions)
    return (await service_row(sessions, service_id)).replicas


async def test_autoscale_on_the_gateways_time_to_first_token_and_queue(
    api: RunningApi, sessions: async_sessionmaker[AsyncSession]
) -> None:
    bounds = Autoscale(min_replicas=1, max_replicas=3, target_queue_per_replica=2.0,
                       target_ttft_s=1.0, cooldown_s=3600)  # fmt: skip
    nodes, _, service_id = await fleet_serving(sessions, api, 3, autoscale=bounds)
    await made_ready(sessions, api, nodes, service_id)
    assert phases(await replicas(sessions, service_id)) == ["ready"]

    async def desired() -> int:
        return await sweep(sessions, service_id)

    # A process gone quiet, slow and busy when it last wrote: it counts for nothing.
    await gateway_says(sessions, "gone", in_flight=50, ttft_p90_s=9.0)
    await stale(sessions, "gone")
    assert await desired() == 1 and await autoscaled(sessions) == []

    # Streams wait 2 s for their first token, target 1 s: one more, the queue empty.
    await gateway_says(sessions, "api-1", ttft_p90_s=2.0)
    assert await desired() == 2
    [up] = await autoscaled(sessions)
    reason = up["data"]["reason"]
    assert "ttft p90 2.000 s of 20 streams (target 1 s, down below 0.5 s)" in reason, reason
    assert "queue 0 over 1 ready" in reason and reason.endswith(": 1 -> 2"), reason
    assert len(await replicas(sessions, service_id)) == 2
    # Still slow, within the cooldown: no change.
    assert await desired() == 2

    # Past the cooldown, between half the target and the target: held, sweep after sweep.
    scaled_at = (await service_row(sessions, service_id)).scaled_at
    assert scaled_at is not None
    await change(sessions, service_id, scaled_at=scaled_at - timedelta(hours=2))
    await gateway_says(sessions, "api-1", ttft_p90_s=0.8)
    assert [await desired() for _ in range(3)] == [2, 2, 2]
    # Quick now, but 1 in flight on the one ready replica is not below half of 2: held.
    await gateway_says(sessions, "api-1", in_flight=1, ttft_p90_s=0.3)
    assert await desired() == 2
    # Both below half: down to the minimum.
    await gateway_says(sessions, "api-1", in_flight=0, ttft_p90_s=0.3)
    assert await desired() == 1
    down = (await autoscaled(sessions))[-1]["data"]["reason"]
    assert "ttft p90 0.300 s" in down and down.endswith(": 2 -> 1"), down

    # The gateway's queue alone, over two API processes (3 + 2 in flight, no time to
    # first token known), the nodes reporting none: ceil(5 / 2) = 3.
    scaled_at = (await service_row(sessions, service_id)).scaled_at
    assert scaled_at is not None
    await change(sessions, service_id, scaled_at=scaled_at - timedelta(hours=2))
    await gateway_says(sessions, "api-1", in_flight=3)
    await gateway_says(sessions, "api-2", in_flight=2)
    assert await desired() == 3
    again = (await autoscaled(sessions))[-1]["data"]["reason"]
    assert "queue 5 over 1 ready (gateway 5 in flight from 2 API processes, nodes 0" in again
    assert "ttft p90 unknown" in again and again.endswith(": 1 -> 3"), again
    assert len(await autoscaled(sessions)) == 3


async def test_streams_waiting_at_the_gateway_scale_the_service_up(
    api_factory: ApiFactory, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """End to end: the API's own row (no row written by the test), from two streams
    relayed through its gateway that the node has not answered yet."""
    api = service_api(api_factory, gateway_first_token_timeout_s=20, gateway_measure_interval_s=0.2)
    bounds = Autoscale(min_replicas=1, max_replicas=2, target_queue_per_replica=1.0,
                       cooldown_s=0)  # fmt: skip
    nodes, _, service_id = await fleet_serving(sessions, api, 2, autoscale=bounds)
    with api.client() as client:
        secret = service_client(client, api)
    [first] = await made_ready(sessions, api, nodes, service_id)
    busy = on(nodes, first.node_id)
    assert (await service_row(sessions, service_id)).replicas == 1
    with (
        ThreadPoolExecutor(2) as pool,
        runtime_channel(api, busy.node) as channel,
    ):
        calls = [pool.submit(stream, api, secret) for _ in range(2)]
        invokes = [await asyncio.to_thread(channel.next_invoke) for _ in calls]

        async def queued() -> bool:
            return (await measured(sessions)).in_flight == 2

        await until(queued, "two streams in flight in the API's row")
        # 2 in flight over 1 ready replica, target 1: up to 2.
        assert await sweep(sessions, service_id) == 2
        for invoke in invokes:
            sent = answer_invoke(api, busy.node, invoke, CHUNKS, content_type="text/event-stream")
            assert sent.status_code == 200, sent.text
        for call in calls:
            call.result(20)
    [up] = await autoscaled(sessions)
    reason = up["data"]["reason"]
    assert "queue 2 over 1 ready (gateway 2 in flight from 1 API processes" in reason, reason
