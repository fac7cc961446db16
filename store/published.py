"""What the relay has already published, read back from the outbox: the admin event
stream's resume (api/admin/events.py, `Last-Event-ID`), and its retention; and what it
has not published yet (`unsent`), which readiness (api/health.py) and the fleet gauges
(workers/fleet_metrics.py) both report.

The outbox keeps each event with its position, the order the relay publishes in, for
the retention period after it was published (`prune`, scheduled by the workers); a
resume from an event pruned since is overflow, as any unknown id is."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import OutboxEvent


@dataclass(frozen=True)
class Unsent:
    """The outbox events not yet published: how many (counted up to a cap) and the age
    of the oldest, in seconds by the database's clock (None when there is none)."""

    count: int
    oldest_s: float | None


async def unsent(session: AsyncSession, *, cap: int) -> Unsent:
    """The relay's backlog, counted up to `cap` rows so that a huge backlog costs a
    bounded scan (the partial index on unsent positions). The rows counted are the
    oldest by position, the relay's order, so the oldest one is always among them."""
    rows = (
        select(OutboxEvent.created_at)
        .where(OutboxEvent.sent_at.is_(None))
        .order_by(OutboxEvent.position)
        .limit(cap)
        .subquery()
    )
    count, oldest = (
        await session.execute(
            select(
                func.count(),
                func.extract("epoch", func.statement_timestamp() - func.min(rows.c.created_at)),
            ).select_from(rows)
        )
    ).one()
    return Unsent(count=int(count), oldest_s=float(oldest) if oldest is not None else None)


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


async def prune(session: AsyncSession, *, retention_s: float, limit: int) -> int:
    """Delete up to `limit` of the oldest events published more than `retention_s` ago
    (the database clock); how many. An event not yet published is never deleted, however
    old: it is the relay's backlog, not history."""
    cutoff = func.now() - timedelta(seconds=retention_s)
    # The relay publishes in position order, so the old published rows are the head of
    # the primary key: the scan stops after `limit` of them.
    oldest = (
        select(OutboxEvent.position)
        .where(OutboxEvent.sent_at.is_not(None), OutboxEvent.sent_at < cutoff)
        .order_by(OutboxEvent.position)
        .limit(limit)
    )
    result = await session.execute(
        delete(OutboxEvent)
        .where(OutboxEvent.position.in_(oldest.scalar_subquery()))
        .returning(OutboxEvent.position)
    )
    return len(result.scalars().all())
