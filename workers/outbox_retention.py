"""Outbox retention: one periodic entry (workers/main.py: schedule). Published events
older than the retention period are deleted in batches that commit on their own, so the
outbox, which every change writes to, does not grow without end. Any number of workers
may prune at once: a row two of them pick is deleted once, and the other's DELETE finds
it gone.

What the outbox is kept for after publication is the admin event stream's resume
(store/published.py); the audit log and the event stream hold the history.
"""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from store.published import prune

logger = logging.getLogger("modelforge.workers.outbox_retention")


async def prune_outbox(
    sessions: async_sessionmaker[AsyncSession], retention_s: float, *, batch_size: int = 5_000
) -> int:
    """Delete every published event past the retention period; how many."""
    total = 0
    while True:
        async with sessions() as session, session.begin():
            deleted = await prune(session, retention_s=retention_s, limit=batch_size)
        total += deleted
        if deleted < batch_size:
            break
    if total:
        logger.info("outbox: %d published events past retention deleted", total)
    return total
