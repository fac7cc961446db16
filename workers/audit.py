"""The audit consumer: every event on the stream becomes one audit row (store/audit.py)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.events import SUBJECT_PREFIX, CloudEvent
from store import audit
from workers.consumer import Connect, EventConsumer

DURABLE = "audit"


def audit_consumer(
    sessions: async_sessionmaker[AsyncSession], connect: Connect, *, batch_size: int = 200
) -> EventConsumer:
    async def handle(events: Sequence[CloudEvent]) -> None:
        async with sessions() as session, session.begin():
            await audit.append(session, events)

    return EventConsumer(DURABLE, f"{SUBJECT_PREFIX}.>", handle, connect, batch_size=batch_size)
