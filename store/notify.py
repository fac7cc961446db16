"""Wake-ups on commit: LISTEN on a channel that a trigger NOTIFYs (migration 0004).

A notification is only a hint to look now: the listener may miss one while it
reconnects, so its users still poll, just rarely. One dedicated connection per listener,
outside the pool, reconnected with backoff when it drops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, Final

import asyncpg
from sqlalchemy.engine import make_url

logger = logging.getLogger("modelforge.notify")

OUTBOX_CHANNEL: Final = "modelforge_outbox"


def _dsn(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _serve_one_connection(
    dsn: str, channel: str, wake: asyncio.Event, stop: asyncio.Event
) -> None:
    """Listen on one connection until stop is set or the connection drops."""
    connection: Any = await asyncpg.connect(dsn, timeout=5)
    try:
        closed = asyncio.Event()
        connection.add_termination_listener(lambda *_: closed.set())
        await connection.add_listener(channel, lambda *_: wake.set())
        wake.set()  # anything committed while nobody listened: look once
        stopping = asyncio.ensure_future(stop.wait())
        dropped = asyncio.ensure_future(closed.wait())
        await asyncio.wait({stopping, dropped}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        dropped.cancel()
    finally:
        with contextlib.suppress(Exception):
            await connection.close(timeout=2)


async def _listen(dsn: str, channel: str, wake: asyncio.Event, stop: asyncio.Event) -> None:
    failures = 0
    while not stop.is_set():
        try:
            await _serve_one_connection(dsn, channel, wake, stop)
            failures = 0
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            failures += 1
            if failures == 1:
                logger.warning("LISTEN %s failed (%s); polling until it is back", channel, exc)
        if not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(0.2 * 2**failures, 5.0))


@contextlib.asynccontextmanager
async def listening(database_url: str, channel: str) -> AsyncIterator[asyncio.Event]:
    """An event set whenever the channel is notified (and after every reconnect)."""
    wake, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(_listen(_dsn(database_url), channel, wake, stop))
    try:
        yield wake
    finally:
        stop.set()
        await task
