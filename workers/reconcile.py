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
from workers.consumer import Connect, EventConsumer

DURABLE = "reconcile"


def reconcile_consumer(
    sessions: async_sessionmaker[AsyncSession], connect: Connect, *, batch_size: int = 200
) -> EventConsumer:
    async def handle(events: Sequence[CloudEvent]) -> None:
        # dict: each node once per batch, in first-seen order.
        node_ids = dict.fromkeys(uuid.UUID(str(e.data["node_id"])) for e in events)
        for node_id in node_ids:
            async with sessions() as session, session.begin():
                await inventory.reconcile(session, node_id)

    return EventConsumer(
        DURABLE,
        subject_filter(event_type=EventType.NODE_INVENTORY_ACCEPTED),
        handle,
        connect,
        batch_size=batch_size,
    )
