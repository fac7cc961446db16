"""The deployment reconciler: one periodic entry (workers/main.py: schedule). It compares
what is desired with what the runtime workers report and moves every deployment that has
not ended one step (store/deployments/reconcile.py: reconcile_one): unavailable when its node went
offline, ready again when the node reports it loaded, a reload when the node lost it, a
periodic health job, the unload of a drain, a load that ended without a report.

One short transaction per deployment, locked with SKIP LOCKED, so any number of workers
may sweep at once and one that dies mid-sweep loses nothing. The job outcomes themselves
move deployments at once, in the agent routes; this sweep is for what no report says.
While the partition breaker holds, nothing is reloaded or failed (no mass rescheduling
during a suspected partition); routing still stops for nodes that went offline.
"""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.events import worker_actor
from store.deployments import reconcile as deployment_reconcile
from store.deployments.rules import ReconcilePolicy
from store.fleet import partition_hold_active

logger = logging.getLogger("modelforge.workers.deployments")

ACTOR = worker_actor("deployments")
PAGE = 500


async def reconcile(
    sessions: async_sessionmaker[AsyncSession], policy: ReconcilePolicy
) -> dict[str, int]:
    """One sweep over every deployment that has not ended; what it did, counted."""
    async with sessions() as session, session.begin():
        hold = await partition_hold_active(session)
    done: dict[str, int] = {}
    after = None
    while True:
        async with sessions() as session, session.begin():
            page = await deployment_reconcile.due(session, limit=PAGE, after=after)
        for deployment_id in page:
            async with sessions() as session, session.begin():
                action = await deployment_reconcile.reconcile_one(
                    session, deployment_id, policy, hold=hold, actor=ACTOR
                )
            if action is not None:
                done[action] = done.get(action, 0) + 1
                logger.info("deployment %s: %s", deployment_id, action)
        if len(page) < PAGE:
            return done
        after = page[-1]
