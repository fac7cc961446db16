"""The API's presence beat: the evidence the sweepers use to tell "the nodes went silent"
from "nobody was listening" (store/fleet.py).

One task per API process, started in the lifespan. A failed beat (database down) is
logged once per outage, not once a second; the next successful one records the gap.

A beat also needs the process's own listener to accept a connection: when the server
begins to shut down it closes the listener at once but runs the lifespan's shutdown only
after draining, and in between it is not hearing heartbeats any more. Beating on then
would let the sweepers count that silence against the nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.background import background
from api.shedding import LoadShedder
from store.fleet import beat

logger = logging.getLogger("modelforge.api.presence")


def _client_host(host: str) -> str:
    """Where this process reaches its own listener bound to host."""
    return {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104


async def _listening(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=1.0)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def _beat_forever(
    sessions: async_sessionmaker[AsyncSession],
    period_s: float,
    gap_s: float,
    merge_within_s: float,
    listener: tuple[str, int],
    shedder: LoadShedder | None,
) -> None:
    failing = False
    host, port = _client_host(listener[0]), listener[1]
    # Refusals since this moment are not reported yet (kept over failed beats).
    unreported_since = time.monotonic()
    while True:
        if not await _listening(host, port):
            # Starting up (not bound yet) or shutting down (closed): no beat either way.
            await asyncio.sleep(period_s)
            continue
        beginning = time.monotonic()
        shed = shedder is not None and shedder.shed_since(unreported_since)
        try:
            async with sessions() as session, session.begin():
                resumed = await beat(session, gap_s=gap_s, merge_within_s=merge_within_s, shed=shed)
        except (SQLAlchemyError, OSError) as exc:
            if not failing:
                logger.warning("presence beat failed (%s); retrying", type(exc).__name__)
            failing = True
        else:
            unreported_since = beginning
            if resumed:
                logger.warning("no API was present for a while: restart grace applies")
            failing = False
        await asyncio.sleep(period_s)


@contextlib.asynccontextmanager
async def presence_beat(
    sessions: async_sessionmaker[AsyncSession],
    *,
    period_s: float,
    gap_s: float,
    merge_within_s: float,
    listener: tuple[str, int],
    shedder: LoadShedder | None = None,
) -> AsyncIterator[None]:
    """merge_within_s: an outage that begins this soon after the last one ended is
    recorded as one with it (store/fleet.py: beat). shedder: whose refusals each beat
    reports, so the sweepers hold liveness while the API sheds (api/shedding.py)."""
    beats = _beat_forever(sessions, period_s, gap_s, merge_within_s, listener, shedder)
    async with background(beats, "presence"):
        yield
