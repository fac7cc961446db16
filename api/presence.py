"""The API's presence beat: the evidence the sweepers use to tell "the nodes went silent"
from "nobody was listening" (store/fleet.py).

One task per API process, started in the lifespan. A failed beat (database down) is
logged once per outage, not once a second; the next successful one records the gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from store.fleet import beat

logger = logging.getLogger("modelforge.api.presence")


async def _beat_forever(
    sessions: async_sessionmaker[AsyncSession], period_s: float, gap_s: float
) -> None:
    failing = False
    while True:
        try:
            async with sessions() as session, session.begin():
                resumed = await beat(session, gap_s=gap_s)
        except (SQLAlchemyError, OSError) as exc:
            if not failing:
                logger.warning("presence beat failed (%s); retrying", type(exc).__name__)
            failing = True
        else:
            if resumed:
                logger.warning("no API was present for a while: restart grace applies")
            failing = False
        await asyncio.sleep(period_s)


@contextlib.asynccontextmanager
async def presence_beat(
    sessions: async_sessionmaker[AsyncSession], *, period_s: float, gap_s: float
) -> AsyncIterator[None]:
    task = asyncio.create_task(_beat_forever(sessions, period_s, gap_s), name="presence")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
