"""What the relay has already published, read back from the outbox: the admin event
stream's resume (api/admin/events.py, `Last-Event-ID`). The outbox keeps every event
with its position, the order the relay publishes in."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import OutboxEvent


async def published_after(
    session: AsyncSession, event_id: uuid.UUID, *, limit: int
) -> list[dict[str, Any]] | None:
    """The envelopes published after that event, in publication order, at most `limit`;
    None when no such event was recorded. Not yet published ones are left out: they
    reach a live subscriber when the relay publishes them."""
    position = (
        await session.execute(select(OutboxEvent.position).where(OutboxEvent.id == event_id))
    ).scalar_one_or_none()
    if position is None:
        return None
    rows = await session.execute(
        select(OutboxEvent.envelope)
        .where(OutboxEvent.position > position, OutboxEvent.sent_at.is_not(None))
        .order_by(OutboxEvent.position)
        .limit(limit)
    )
    return list(rows.scalars().all())
