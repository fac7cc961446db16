"""The audit consumer: every event on the stream becomes one audit row (store/audit.py)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.events import SUBJECT_PREFIX, CloudEvent
from store import audit
from workers.consumer import Handler

DURABLE = "audit"
FILTER = f"{SUBJECT_PREFIX}.>"


def handler(sessions: async_sessionmaker[AsyncSession]) -> Handler:
    async def handle(events: Sequence[CloudEvent]) -> None:
        async with sessions() as session, session.begin():
            await audit.append(session, events)

    return handle
