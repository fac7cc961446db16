"""Outbox retention (store/published.py: prune, workers/outbox_retention.py) on a real
PostgreSQL, and through real `modelforge worker` processes on a real NATS."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.protocol import AUDIT
from tests.agent.harness import wait_until
from tests.api_server import ApiFactory
from tests.flows import enroll
from tests.services import db_fetch, run_async
from tests.worker_processes import Workers
from workers.outbox_retention import prune_outbox

WEEK_S = 7 * 24 * 3600.0


async def _insert(
    sessions: async_sessionmaker[AsyncSession], count: int, *, age: timedelta, published: bool
) -> list[uuid.UUID]:
    ids = [uuid.uuid4() for _ in range(count)]
    async with sessions() as session, session.begin():
        for event_id in ids:
            await session.execute(
                text(
                    "INSERT INTO outbox (id, subject, envelope, created_at, sent_at) VALUES "
                    "(:id, 'test.retention', CAST(:envelope AS jsonb), "
                    "now() - CAST(:age AS interval), "
                    "CASE WHEN :published THEN now() - CAST(:age AS interval) END)"
                ),
                {
                    "id": event_id,
                    "envelope": json.dumps({"id": str(event_id)}),
                    "age": age,
                    "published": published,
                },
            )
    return ids


async def test_only_published_events_past_retention_go_and_racing_prunes_delete_each_once(
    sessions: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    old = await _insert(sessions, 23, age=timedelta(days=8), published=True)
    recent = await _insert(sessions, 3, age=timedelta(days=1), published=True)
    # Never published, however old: the relay's backlog, not history.
    backlog = await _insert(sessions, 2, age=timedelta(days=30), published=False)

    # Two workers pruning at once, in batches smaller than the work.
    counts = await asyncio.gather(
        prune_outbox(sessions, WEEK_S, batch_size=4), prune_outbox(sessions, WEEK_S, batch_size=4)
    )
    assert sum(counts) == len(old), counts
    left = {row["id"] for row in await db_fetch(database_url, "SELECT id FROM outbox")}
    assert left == set(recent) | set(backlog)
    # Nothing more is due: a second run deletes nothing.
    assert await prune_outbox(sessions, WEEK_S) == 0


@pytest.mark.slow
def test_workers_prune_published_events_on_their_schedule(
    api_factory: ApiFactory, workers: Workers
) -> None:
    workers.env["MODELFORGE_OUTBOX_RETENTION_S"] = "1"
    workers.env["MODELFORGE_OUTBOX_PRUNE_PERIOD_S"] = "0.5"
    api = workers.api(api_factory)
    workers.start(1)
    with api.client() as client:
        node = enroll(client, api, "retained")
    database_url = api.settings.database_url

    def outbox_rows() -> int:
        rows = run_async(lambda: db_fetch(database_url, "SELECT count(*) AS n FROM outbox"))
        return int(rows[0]["n"])

    def audited() -> bool:
        with api.client() as client:
            page = client.get(
                AUDIT, params={"target_id": node.node_id}, headers=api.admin_headers
            ).json()
        return bool(page["items"])

    # Relayed and audited first; then gone from the outbox, while the history stays.
    wait_until(audited, 30, "the enrollment audited by the worker")
    wait_until(lambda: outbox_rows() == 0, 30, "the published events pruned")
    assert audited()
