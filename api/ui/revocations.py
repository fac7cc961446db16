"""Dashboard logouts heard by every API process (store/ui_sessions.py).

A process reads every recorded logout before it serves, then LISTENs: each NOTIFY
revokes that session here too, and after every reconnect the recorded ones are read
again, so a logout committed while the LISTEN connection was down is not missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.ui.session import UiSessions
from store import ui_sessions
from store.notify import UI_LOGOUTS_CHANNEL, Listener, listening_with

logger = logging.getLogger("modelforge.api.ui")


async def _read_recorded(sessions: async_sessionmaker[AsyncSession], ui: UiSessions) -> None:
    try:
        async with sessions() as session, session.begin():
            recorded = await ui_sessions.revoked(session)
    except (SQLAlchemyError, OSError) as exc:
        # The next reconnect reads them again; until then only NOTIFYs are heard.
        logger.warning("could not read the dashboard logouts (%s)", type(exc).__name__)
        return
    for nonce, expires_at in recorded.items():
        ui.revoke_nonce(nonce, expires_at)


def _on_payload(ui: UiSessions, payload: str) -> None:
    nonce, _, expires_at = payload.rpartition(":")
    if nonce and expires_at.isdigit():
        ui.revoke_nonce(nonce, int(expires_at))


@contextlib.asynccontextmanager
async def shared_logouts(
    database_url: str, sessions: async_sessionmaker[AsyncSession], ui: UiSessions
) -> AsyncIterator[None]:
    """For the lifespan of the API process; a no-op while the dashboard is disabled."""
    if not ui.enabled:
        yield
        return
    await _read_recorded(sessions, ui)
    reads: set[asyncio.Task[None]] = set()

    def connected(up: bool) -> None:
        if up:
            task = asyncio.ensure_future(_read_recorded(sessions, ui))
            reads.add(task)
            task.add_done_callback(reads.discard)

    listener = Listener(on_payload=lambda payload: _on_payload(ui, payload), on_connected=connected)
    try:
        async with listening_with(database_url, UI_LOGOUTS_CHANNEL, listener):
            yield
    finally:
        for read in list(reads):
            read.cancel()
