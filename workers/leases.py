"""Lease expiry: one periodic entry (workers/main.py: schedule). Every due lease is taken
back (store/leases.py: expire_due), in batches that commit on their own; any number of
workers may sweep at once (SKIP LOCKED), and one that dies mid-batch loses nothing (its
transaction rolls back and the next sweep finds the same leases due).

While the partition breaker holds (store/fleet.py), expiry holds too: nodes that look
silent are more likely cut off than dead, and expiring their leases would re-queue a
storm of work that is still running. The hold ends when the incident resolves or an
operator acknowledges it.
"""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.events import worker_actor
from store.fleet import partition_hold_active
from store.leases import LeasePolicy, expire_due

logger = logging.getLogger("modelforge.workers.leases")

ACTOR = worker_actor("lease_expiry")


async def expire(
    sessions: async_sessionmaker[AsyncSession], policy: LeasePolicy, *, batch_size: int = 100
) -> int:
    """Take back every lease past its expiry; how many. None while a partition holds."""
    async with sessions() as session, session.begin():
        if await partition_hold_active(session):
            return 0
    total = 0
    while True:
        async with sessions() as session, session.begin():
            expired = await expire_due(session, policy, batch_size=batch_size, actor=ACTOR)
            for job in expired:
                logger.info(
                    "job %s: lease expired (attempt %d) -> %s", job.id, job.attempt, job.state
                )
        total += len(expired)
        if len(expired) < batch_size:
            return total
