"""Recorded liveness transitions: decided from server-received time, once, by any sweeper."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.protocol import AUDIT
from store.engine import make_engine, make_sessionmaker
from store.liveness_sweep import sweep
from tests.admin_helpers import decommission
from tests.api_server import ApiFactory, RunningApi
from tests.flows import HEARTBEAT, NO_BREAKER, NODES, THRESHOLDS, enroll, heartbeat_body, now


def _api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(
        stale_after_s=THRESHOLDS.stale_after_s, offline_after_s=THRESHOLDS.offline_after_s
    )


def _transitions(api: RunningApi, node_id: str) -> list[tuple[str, str, str]]:
    api.settle()
    with api.client() as client:
        rows = client.get(
            AUDIT,
            params={"action": "node.liveness.changed", "target_id": node_id, "limit": 1000},
            headers=api.admin_headers,
        ).json()["items"]
    return [
        (r["details"]["previous"], r["details"]["current"], r["details"]["decided_by"])
        for r in reversed(rows)
    ]


def _beat(api: RunningApi, node: Any, **extra: Any) -> None:
    with api.client() as client:
        response = client.post(
            HEARTBEAT, json=heartbeat_body(node.node_id, **extra), headers=node.headers
        )
        assert response.status_code == 200, response.text


async def _sweep_until(
    sessions: async_sessionmaker[AsyncSession], deadline_s: float, want: int
) -> list[Any]:
    found: list[Any] = []
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and len(found) < want:
        found += await sweep(sessions, THRESHOLDS)
        await asyncio.sleep(0.1)
    return found


async def test_online_stale_offline_and_back(
    api_factory: ApiFactory, sessions: async_sessionmaker[AsyncSession]
) -> None:
    api = _api(api_factory)
    with api.client() as client:
        node = enroll(client, api)
    _beat(api, node)
    started = time.monotonic()
    found = await _sweep_until(sessions, 5, want=2)
    elapsed = time.monotonic() - started
    assert [(t.previous, t.current) for t in found] == [("online", "stale"), ("stale", "offline")]
    # Not before the offline threshold (how soon after it is measured in ops/bench).
    assert elapsed >= THRESHOLDS.offline_after_s
    _beat(api, node)
    assert _transitions(api, node.node_id) == [
        ("offline", "online", "heartbeat"),
        ("online", "stale", "sweep"),
        ("stale", "offline", "sweep"),
        ("offline", "online", "heartbeat"),
    ]
    # Nothing more to do for a fresh node.
    assert await sweep(sessions, THRESHOLDS) == []


async def test_future_clock_cannot_keep_a_node_online(
    api_factory: ApiFactory, sessions: async_sessionmaker[AsyncSession]
) -> None:
    api = _api(api_factory)
    with api.client() as client:
        node = enroll(client, api)
    # The agent's clock says next year; liveness only uses when the server received it.
    _beat(api, node, observed_at=(now() + timedelta(days=365)).isoformat())
    found = await _sweep_until(sessions, 5, want=2)
    assert [(t.previous, t.current) for t in found] == [("online", "stale"), ("stale", "offline")]
    with api.client() as client:
        detail = client.get(f"{NODES}/{node.node_id}", headers=api.admin_headers).json()
    assert detail["liveness"] == "offline"


async def test_disabled_and_decommissioned_nodes_are_never_swept(
    api_factory: ApiFactory, sessions: async_sessionmaker[AsyncSession]
) -> None:
    api = _api(api_factory)
    with api.client() as client:
        disabled = enroll(client, api, hostname="disabled")
        gone = enroll(client, api, hostname="gone")
    _beat(api, disabled)
    _beat(api, gone)
    with api.client() as client:
        assert (
            client.patch(
                f"{NODES}/{disabled.node_id}", json={"enabled": False}, headers=api.admin_headers
            ).status_code
            == 200
        )
        assert decommission(client, api, gone.node_id).status_code == 200
    # Past the offline threshold, to show that the sweep records nothing for them: a
    # window for what must not happen, not a wait for a condition.
    await asyncio.sleep(THRESHOLDS.offline_after_s + 0.3)
    assert await sweep(sessions, THRESHOLDS) == []
    for node in (disabled, gone):
        assert _transitions(api, node.node_id) == [("offline", "online", "heartbeat")]


async def test_concurrent_sweepers_record_each_transition_once(
    api_factory: ApiFactory, database_url: str
) -> None:
    api = _api(api_factory)
    with api.client() as client:
        nodes = [enroll(client, api, hostname=f"n{i}") for i in range(30)]
    for node in nodes:
        _beat(api, node)
    # Every node due for offline at once: time must pass (the database clock decides).
    await asyncio.sleep(THRESHOLDS.offline_after_s + 0.3)
    # Separate engines: separate connections, as separate worker processes would have.
    engines = [make_engine(database_url, pool_size=2) for _ in range(6)]
    try:
        results = await asyncio.gather(
            *(
                sweep(make_sessionmaker(engine), THRESHOLDS, breaker=NO_BREAKER, batch_size=7)
                for engine in engines
            )
        )
    finally:
        for engine in engines:
            await engine.dispose()
    recorded = [t for result in results for t in result]
    # Straight from online to offline (both thresholds passed), once per node.
    assert sorted(t.node_id for t in recorded) == sorted(n.node_id for n in nodes)
    assert {(t.previous, t.current) for t in recorded} == {("online", "offline")}
    for node in nodes[:5]:
        assert _transitions(api, node.node_id) == [
            ("offline", "online", "heartbeat"),
            ("online", "offline", "sweep"),
        ]
