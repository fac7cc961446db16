"""The service reconciler: one periodic entry (workers/main.py: schedule). It pages over
every service not deleted and moves each one step (store/services/reconcile.py:
reconcile_one): follow its replicas, place, heal, scale, roll out, delete.

One short transaction per service, its row locked with SKIP LOCKED, so any number of
workers may sweep at once (none places a replica another is placing: the one that holds
the row moves the service, the others pass it by) and one that dies mid-sweep loses
nothing. A step that fails (a deadlock between two services' steps over two nodes, a
value no model accepts) is rolled back alone, logged, and tried again on the next sweep;
the services after it are still swept.
While the partition breaker holds, nothing is healed (store/fleet.py).
"""

from __future__ import annotations

import logging
import uuid

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.events import worker_actor
from store.fleet import partition_hold_active
from store.services import reconcile as service_reconcile
from store.services.reconcile import ServicePolicy
from store.services.snapshot import FleetCache

logger = logging.getLogger("modelforge.workers.services")

ACTOR = worker_actor("services")
PAGE = 200
# A step that used its whole placement quota is followed at once by another (each its
# own short transaction), up to this many: a large service fills within one sweep.
ROUNDS = 8


async def reconcile(
    sessions: async_sessionmaker[AsyncSession], policy: ServicePolicy, cache: FleetCache
) -> dict[str, list[str]]:
    """One sweep over every service not deleted; what each step did, by service id.
    `cache`: this process's fleet snapshot, kept from one sweep to the next."""
    async with sessions() as session, session.begin():
        hold = await partition_hold_active(session)
    done: dict[str, list[str]] = {}
    after = None
    while True:
        async with sessions() as session, session.begin():
            page = await service_reconcile.due(session, limit=PAGE, after=after)
        for service_id in page:
            actions = await _steps(sessions, service_id, policy, hold, cache)
            if actions:
                done[str(service_id)] = actions
                for action in actions:
                    logger.info("service %s: %s", service_id, action)
        if len(page) < PAGE:
            return done
        after = page[-1]


async def _steps(
    sessions: async_sessionmaker[AsyncSession],
    service_id: uuid.UUID,
    policy: ServicePolicy,
    hold: bool,
    cache: FleetCache,
) -> list[str]:
    done: list[str] = []
    for _ in range(ROUNDS):
        try:
            async with sessions() as session, session.begin():
                actions = await service_reconcile.reconcile_one(
                    session, service_id, policy, hold=hold, actor=ACTOR, cache=cache
                )
        except DBAPIError as error:
            logger.warning("service %s: step rolled back (%s)", service_id, error.orig)
            return done
        except Exception:
            # One service's step that fails for another reason (a stored value no model
            # accepts) must not stop the sweep for every service after it.
            logger.exception("service %s: step failed", service_id)
            return done
        done += actions or []
        if service_reconcile.placements(actions or []) < policy.max_placements_per_step:
            return done
    return done
