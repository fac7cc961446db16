"""Lease expiry takes its place in the node's event order (store/locks.py): a job whose
node's event lock is held elsewhere is left for the next sweep, never expired around
the holder, and expired once the lock is free. Real API, real PostgreSQL, the real
sweep (workers/leases.py: expire)."""

from __future__ import annotations

import asyncio
import time
import uuid

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from store.leases import LeasePolicy
from tests.api_server import ApiFactory
from tests.artifact_flows import claimed, created, get_job, node_with_roots
from tests.node_locks import HoldNodeLock
from tests.services import db_fetch
from workers.leases import expire

LEASE_S = 0.5


async def test_a_due_lease_waits_while_its_node_is_busy_and_expires_after(
    api_factory: ApiFactory,
    sessions: async_sessionmaker[AsyncSession],
    lock_holder: HoldNodeLock,
    database_url: str,
) -> None:
    api = api_factory(job_lease_s=LEASE_S, job_retry_base_s=0.1)
    policy = LeasePolicy(lease_s=LEASE_S, retry_base_s=0.1)
    with api.client() as client:
        node = node_with_roots(client, api)
        job_id = created(client, api, node, max_attempts=2)
        claimed(client, node)
    release = await lock_holder(node.node_id)
    deadline = time.monotonic() + 20
    while not await db_fetch(
        database_url,
        "SELECT 1 FROM jobs WHERE id = $1 AND lease_expires_at < statement_timestamp()",
        uuid.UUID(job_id),
    ):
        assert time.monotonic() < deadline, "the lease never ran out"
        await asyncio.sleep(0.05)
    # Due, but its node's event lock is held: left alone, however often swept.
    assert await asyncio.gather(*(expire(sessions, policy) for _ in range(4))) == [0] * 4
    with api.client() as client:
        assert get_job(client, api, job_id)["state"] == "leased"
    release.set()
    deadline = time.monotonic() + 20
    while (expired := await expire(sessions, policy)) == 0:
        assert time.monotonic() < deadline, "the lease never expired once the node was free"
        await asyncio.sleep(0.05)
    assert expired == 1
    with api.client() as client:
        view = get_job(client, api, job_id)
    assert view["state"] == "queued" and view["attempt"] == 1, view
