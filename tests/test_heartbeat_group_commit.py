"""Routine heartbeats are group-committed: on the database clock, within the flush
interval, never backwards, and an API crash costs at most one interval and never a
false stale or offline (api/heartbeat_buffer.py)."""

from __future__ import annotations

import signal
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from store.engine import make_engine, make_sessionmaker
from store.liveness import LivenessThresholds
from store.liveness_sweep import sweep
from tests.admin_helpers import db_scalar
from tests.agent.harness import wait_until
from tests.api_processes import (
    answered_from_cache,
    api_processes,
    enrolled,
    metric,
    routine_heartbeats,
)
from tests.api_server import ApiFactory
from tests.flows import HEARTBEAT, EnrolledNode, enroll, heartbeat_body
from tests.services import admin_execute, run_async

FLUSH_S = 0.2


def last_heartbeat(database_url: str, node_id: str) -> datetime:
    value: datetime = db_scalar(
        database_url, "SELECT last_heartbeat_at FROM nodes WHERE id = :id", id=node_id
    )
    return value


def lag_s(database_url: str, node_id: str) -> float:
    """How far the stored heartbeat is behind the database clock now."""
    value: float = db_scalar(
        database_url,
        "SELECT EXTRACT(EPOCH FROM statement_timestamp() - last_heartbeat_at) FROM nodes"
        " WHERE id = :id",
        id=node_id,
    )
    return value


async def sweep_once(database_url: str, thresholds: LivenessThresholds) -> list[Any]:
    engine = make_engine(database_url, pool_size=1)
    try:
        return list(await sweep(make_sessionmaker(engine), thresholds))
    finally:
        await engine.dispose()


def timestamps_flushed(client: httpx.Client) -> float:
    """Routine heartbeats this API's group commit has written."""
    return metric(client, "modelforge_heartbeat_timestamps_flushed_total")


def beat(client: httpx.Client, node: EnrolledNode) -> dict[str, Any]:
    response = client.post(HEARTBEAT, json=heartbeat_body(node.node_id), headers=node.headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_routine_heartbeats_land_within_the_flush_interval(
    api_factory: ApiFactory, database_url: str
) -> None:
    api = api_factory(heartbeat_flush_interval_s=FLUSH_S)
    with api.client() as client:
        node = enroll(client, api)
        answered_from_cache(client, node)
        # Pacing: every earlier heartbeat is then well before the one below.
        time.sleep(0.2)
        before = routine_heartbeats(client)
        answer = beat(client, node)
        assert routine_heartbeats(client) == before + 1
        received = datetime.fromisoformat(answer["received_at"])

        # Not written yet, or written within the interval, at the time the API answered:
        # the group commit writes the time the API answered with.
        def landed() -> bool:
            stored = last_heartbeat(database_url, node.node_id)
            return abs(stored - received) < timedelta(milliseconds=100)

        # The bound is the shared box's, not the claim's: the claim is the value written.
        wait_until(landed, 25 * FLUSH_S, "the routine heartbeat flushed")
        stored = last_heartbeat(database_url, node.node_id)
        # A transactional write meanwhile is never overwritten by an older routine one.
        node_key = uuid.UUID(node.node_id)  # a parsed UUID: safe to write into the SQL
        ahead = "UPDATE nodes SET last_heartbeat_at = statement_timestamp() + interval '1 hour'"
        admin_execute(database_url, f"{ahead} WHERE id = '{node_key}'")
        future = last_heartbeat(database_url, node.node_id)
        assert future > stored + timedelta(minutes=59)
        flushes = timestamps_flushed(client)
        beat(client, node)
        wait_until(lambda: timestamps_flushed(client) > flushes, 25 * FLUSH_S, "a flush")
        assert last_heartbeat(database_url, node.node_id) == future


def test_a_killed_api_loses_at_most_one_interval_and_no_node_goes_stale(
    database_url: str, nats_url: str, tmp_path: Path
) -> None:
    stale_s = 2.0
    # Any: MODELFORGE_<KEY> settings for api_processes, whose own `processes` is an int.
    settings: dict[str, Any] = {
        "stale_after_s": str(stale_s),
        "offline_after_s": "4",
        "heartbeat_flush_interval_s": str(FLUSH_S),
        "presence_gap_s": "5",
    }
    with api_processes(2, database_url, nats_url, tmp_path, **settings) as apis:
        (first_url, first), (second_url, _) = apis
        with httpx.Client(base_url=first_url, timeout=10) as a:
            node_id, credential = enrolled(a, "group-commit")
            node = EnrolledNode(node_id, credential)
            deadline = time.monotonic() + 5
            while routine_heartbeats(a) < 5:
                assert time.monotonic() < deadline, "heartbeats never became routine"
                beat(a, node)
                time.sleep(0.05)
            beat(a, node)
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
        # What was flushed before the kill: at most an interval (and the beat spacing) old.
        lost = lag_s(database_url, node_id)
        assert lost < FLUSH_S + 0.05 + 0.5, lost
        # The agent moves on to the other API; sweeps across twice the stale threshold
        # find nothing to record.
        thresholds = LivenessThresholds(stale_after_s=stale_s, offline_after_s=4.0)
        recorded = run_async(lambda: sweep_once(database_url, thresholds))
        with httpx.Client(base_url=second_url, timeout=10) as b:
            until = time.monotonic() + stale_s * 2
            while time.monotonic() < until:
                beat(b, node)
                time.sleep(0.3)  # an agent's pace, across the window: not a wait
                recorded += run_async(lambda: sweep_once(database_url, thresholds))
                assert lag_s(database_url, node_id) < stale_s / 2
        assert recorded == []
    transitions = db_scalar(
        database_url,
        "SELECT count(*) FROM outbox WHERE envelope->>'action' = 'node.liveness.changed'"
        " AND envelope->'data'->>'current' IN ('stale', 'offline')",
    )
    assert transitions == 0
