"""The reconcile consumer: applies accepted inventory reports (store/inventory.py).

A batch names some nodes; each is reconciled in its own transaction, from what is
pending in the database, so the message is only a wake-up call: redelivered, duplicated
or out of order, it changes nothing that the stored observations do not already say.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.events import CloudEvent, EventType, subject_filter
from store import inventory
from workers.consumer import Handler

DURABLE = "reconcile"
FILTER = subject_filter(event_type=EventType.NODE_INVENTORY_ACCEPTED)


def handler(sessions: async_sessionmaker[AsyncSession]) -> Handler:
    async def handle(events: Sequence[CloudEvent]) -> None:
        # dict: each node once per batch, in first-seen order.
        node_ids = dict.fromkeys(uuid.UUID(str(e.data["node_id"])) for e in events)
        for node_id in node_ids:
            async with sessions() as session, session.begin():
                await inventory.reconcile(session, node_id)

    return handle
