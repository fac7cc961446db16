"""Load shedding (api/shedding.py) and the liveness hold it brings (store/fleet.py:
shedding_recently), through a real API, real PostgreSQL and the real sweep.

The transactional path is made to hold a request deterministically: a returning node's
heartbeat records a liveness event under its node lock, and the test holds that lock
from a session of its own. With a bound of one request in flight, the next uncached
node's heartbeat and telemetry are refused 429 `overloaded` with Retry-After, a cached
node's routine heartbeat is still answered, and once the held request drains, admission
resumes.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.errors import TooManyRequests
from api.metrics import ApiMetrics
from api.shedding import LoadShedder
from schemas.protocol import NODES, TELEMETRY
from store.fleet import beat, shedding_recently
from store.liveness import LivenessThresholds
from store.liveness_sweep import sweep
from tests.admin_helpers import refused
from tests.api_processes import metric
from tests.api_server import ApiFactory, api_on_thresholds
from tests.flows import HEARTBEAT, EnrolledNode, enroll, heartbeat_body, telemetry_body
from tests.node_locks import HoldNodeLock
from tests.services import db_fetch


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}")


async def shedding_recently_now(
    sessions: async_sessionmaker[AsyncSession], within_s: float
) -> bool:
    async with sessions() as session, session.begin():
        return await shedding_recently(session, within_s=within_s)


def test_admission_sheds_at_the_bound_and_resumes_only_once_half_drained() -> None:
    shedder = LoadShedder(4, 10.0, ApiMetrics())
    held = [shedder.admitted("r") for _ in range(4)]
    for place in held:
        place.__enter__()
    with pytest.raises(TooManyRequests) as refusal:
        shedder.admitted("r").__enter__()
    seconds = int(refusal.value.headers["Retry-After"])
    assert 1 <= seconds <= 10
    # Three in flight: above half the bound, still shedding (the hysteresis).
    held.pop().__exit__(None, None, None)
    with pytest.raises(TooManyRequests):
        shedder.admitted("r").__enter__()
    held.pop().__exit__(None, None, None)
    with shedder.admitted("r"):
        assert shedder.in_flight == 3
    assert shedder.shed_since(0.0)
    assert not LoadShedder(0, 10.0, ApiMetrics()).shed_since(0.0)


async def test_overload_is_refused_with_retry_after_and_routine_heartbeats_still_answer(
    api_factory: ApiFactory,
    sessions: async_sessionmaker[AsyncSession],
    lock_holder: HoldNodeLock,
    database_url: str,
) -> None:
    api = api_factory(shed_in_flight=1, presence_period_s=0.1)
    with api.client() as client:
        held, refused_node, cached = (enroll(client, api, f"shed-{i}") for i in range(3))
        answer = client.post(HEARTBEAT, json=heartbeat_body(cached.node_id), headers=cached.headers)
        assert answer.status_code == 200, answer.text
    release = await lock_holder(held.node_id)
    async with api.async_client() as fleet:

        async def beat(node: EnrolledNode) -> httpx.Response:
            return await fleet.post(
                HEARTBEAT, json=heartbeat_body(node.node_id), headers=node.headers
            )

        # Never heard: its comeback is an event under the node lock the test holds.
        waiting = asyncio.create_task(beat(held))

        async def one_in_flight() -> bool:
            text_ = (await fleet.get("/metrics")).text
            return "modelforge_node_requests_waiting 1.0" in text_

        await _until(one_in_flight, "the held heartbeat in flight")
        shed_beat = await beat(refused_node)
        shed_sample = await fleet.put(
            TELEMETRY, json=telemetry_body(refused_node.node_id, 1), headers=refused_node.headers
        )
        routine = await beat(cached)
        # A request that is no node's is refused for what it is, shedding or not.
        unpresentable = [
            await fleet.post(HEARTBEAT, json=heartbeat_body(refused_node.node_id), headers=h)
            for h in ({}, {"Authorization": "Bearer not-a-credential"})
        ]
        malformed_sample = await fleet.put(
            TELEMETRY,
            json=telemetry_body(refused_node.node_id, 1),
            headers={"Authorization": "Basic eA=="},
        )
        assert not waiting.done()
        release.set()
        held_answer = await waiting
        after = await beat(refused_node)
    for shed in (shed_beat, shed_sample):
        refused(shed, 429, "overloaded")
        assert 1 <= int(shed.headers["Retry-After"]) <= 10, shed.headers
    refused(unpresentable[0], 401, "credential_missing")
    refused(unpresentable[1], 401, "credential_malformed")
    refused(malformed_sample, 401, "credential_malformed")
    assert routine.status_code == 200, routine.text
    assert held_answer.status_code == 200, held_answer.text
    assert after.status_code == 200, after.text
    with api.client() as client:
        detail = client.get(f"{NODES}/{refused_node.node_id}", headers=api.admin_headers).json()
        assert detail["liveness"] == "online", detail
        route = f'modelforge_requests_shed_total{{route="{HEARTBEAT}"}}'
        assert metric(client, route) == 1.0

    async def shed_reported() -> bool:
        rows = await db_fetch(
            database_url, "SELECT shed_at FROM control_plane_presence WHERE component = 'api'"
        )
        return bool(rows) and rows[0]["shed_at"] is not None

    # The presence beat reports the refusals, which holds the sweepers.
    await _until(shed_reported, "the shed reported with the presence beat")


async def test_the_sweep_records_nothing_for_a_stale_threshold_after_a_shed(
    api_factory: ApiFactory, sessions: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    thresholds = LivenessThresholds(
        stale_after_s=1.0, offline_after_s=2.0, restart_grace_s=1.0, presence_gap_s=0.4
    )
    api = api_on_thresholds(api_factory, thresholds)
    with api.client() as client:
        node = enroll(client, api, "held-by-shedding")
        answer = client.post(HEARTBEAT, json=heartbeat_body(node.node_id), headers=node.headers)
        assert answer.status_code == 200, answer.text

        async def computed_offline() -> bool:
            detail = client.get(f"{NODES}/{node.node_id}", headers=api.admin_headers).json()
            return bool(detail["liveness"] == "offline")

        await _until(computed_offline, "the node's silence past the offline threshold")
        # As another API process would report it: it refused node requests just now.
        async with sessions() as session, session.begin():
            await beat(session, gap_s=thresholds.presence_gap_s, shed=True)
        assert await shedding_recently_now(sessions, thresholds.stale_after_s)
        # Moved an hour on, so that a sweep that runs late on a loaded box still falls
        # inside the hold.
        async with sessions() as session, session.begin():
            await session.execute(
                text("UPDATE control_plane_presence SET shed_at = shed_at + interval '1 hour'")
            )
        assert await sweep(sessions, thresholds) == []
        recorded = await db_fetch(
            database_url, "SELECT liveness FROM nodes WHERE id = $1", uuid.UUID(node.node_id)
        )
        assert recorded[0]["liveness"] == "online"
        # A stale threshold after the last refusal, the silence counts again.
        async with sessions() as session, session.begin():
            await session.execute(
                text("UPDATE control_plane_presence SET shed_at = shed_at - interval '2 hours'")
            )
        transitions = await sweep(sessions, thresholds)
    assert [(t.node_id, t.current) for t in transitions] == [(node.node_id, "offline")]
