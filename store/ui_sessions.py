"""Dashboard logouts, shared by every API process: a row per ended session until it
would have expired, and a NOTIFY so running processes hear it at once
(api/ui/revocations.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from store.models import UiSessionRevocation
from store.notify import UI_LOGOUTS_CHANNEL


async def record_logout(session: AsyncSession, nonce: str, expires_at: int) -> None:
    """In the caller's transaction: the NOTIFY goes out when it commits."""
    table = UiSessionRevocation
    await session.execute(delete(table).where(table.expires_at <= func.now()))
    await session.execute(
        insert(table)
        .values(nonce=nonce, expires_at=datetime.fromtimestamp(expires_at, UTC))
        .on_conflict_do_nothing(index_elements=[table.nonce])
    )
    await session.execute(select(func.pg_notify(UI_LOGOUTS_CHANNEL, f"{nonce}:{expires_at}")))


async def revoked(session: AsyncSession) -> dict[str, int]:
    """Every ended session not expired yet: nonce -> expiry (epoch seconds)."""
    table = UiSessionRevocation
    rows = await session.execute(
        select(table.nonce, table.expires_at).where(table.expires_at > func.now())
    )
    return {nonce: int(expires_at.timestamp()) for nonce, expires_at in rows}
