"""Wake-ups on commit: LISTEN on a channel that a trigger NOTIFYs (migration 0004).

A notification is only a hint to look now: the listener may miss one while it
reconnects, so its users still poll, just rarely. One dedicated connection per listener,
outside the pool, reconnected with backoff when it drops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Final

import asyncpg
from sqlalchemy.engine import make_url

logger = logging.getLogger("modelforge.notify")

OUTBOX_CHANNEL: Final = "modelforge_outbox"
# Payload: a node id, whenever something an API caches about the node changed
# (credentials, enabled, decommissioned, recorded liveness, agent facts): migration 0006.
NODE_CHANGES_CHANNEL: Final = "modelforge_node_changes"
# Payload `c:<service client id>` or `d:<deployment id>`, whenever either row changes
# (migration 0011): what the gateway caches (api/gateway/cache.py).
GATEWAY_CHANGES_CHANNEL: Final = "modelforge_gateway_changes"
# Payload `<nonce>:<expires at, epoch seconds>` of a dashboard session ended by logout
# (store/ui_sessions.py, api/ui/revocations.py).
UI_LOGOUTS_CHANNEL: Final = "modelforge_ui_logouts"


def _dsn(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


@dataclass(frozen=True)
class Listener:
    """What a LISTEN connection reports: each notification's payload, and whether it is
    listening at all (a user that relies on not missing one must know when it might)."""

    on_payload: Callable[[str], None]
    on_connected: Callable[[bool], None] = lambda _: None


async def _serve_one_connection(
    dsn: str, channel: str, listener: Listener, stop: asyncio.Event
) -> None:
    """Listen on one connection until stop is set or the connection drops."""
    connection: Any = await asyncpg.connect(dsn, timeout=5)
    try:
        closed = asyncio.Event()
        connection.add_termination_listener(lambda *_: closed.set())
        await connection.add_listener(channel, lambda *args: listener.on_payload(args[-1]))
        listener.on_connected(True)
        stopping = asyncio.ensure_future(stop.wait())
        dropped = asyncio.ensure_future(closed.wait())
        await asyncio.wait({stopping, dropped}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        dropped.cancel()
    finally:
        listener.on_connected(False)
        with contextlib.suppress(Exception):
            await connection.close(timeout=2)


async def listen(database_url: str, channel: str, listener: Listener, stop: asyncio.Event) -> None:
    """LISTEN until stop is set, reconnecting with backoff whenever the connection drops."""
    dsn = _dsn(database_url)
    failures = 0
    while not stop.is_set():
        try:
            await _serve_one_connection(dsn, channel, listener, stop)
            failures = 0
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            failures += 1
            if failures == 1:
                logger.warning("LISTEN %s failed (%s); retrying until it is back", channel, exc)
        if not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(0.2 * 2**failures, 5.0))


@contextlib.asynccontextmanager
async def listening_with(
    database_url: str, channel: str, listener: Listener
) -> AsyncIterator[None]:
    """`listen` in a task of its own for the block; stopped and awaited when it ends."""
    stop = asyncio.Event()
    task = asyncio.create_task(listen(database_url, channel, listener, stop))
    try:
        yield
    finally:
        stop.set()
        await task


@contextlib.asynccontextmanager
async def listening(database_url: str, channel: str) -> AsyncIterator[asyncio.Event]:
    """An event set whenever the channel is notified, and after every (re)connect:
    anything committed while nobody listened is looked at once."""
    wake = asyncio.Event()

    def connected(up: bool) -> None:
        if up:
            wake.set()

    listener = Listener(on_payload=lambda _: wake.set(), on_connected=connected)
    async with listening_with(database_url, channel, listener):
        yield wake
