"""Held streams (the agents' notification channels, the gateway's SSE streams to come)
end when the API begins to stop.

uvicorn stops in this order: it stops accepting, waits for every open connection to
finish, and only then runs the lifespan's shutdown. A held stream never finishes by
itself, so without this the API would wait until whoever stops it gives up and kills it
(43 s under `modelforge up`), and the agents would see a broken connection rather than
an ended stream. api/server.py calls `close_all` as uvicorn's shutdown begins (after
the listeners close, so a client that reconnects at once reaches another replica); every
stream wrapped in `hold` then ends at its next step, and the response completes.

A held stream also outlives the check that opened it: `rechecked` re-runs that check at
every keep-alive, so a node whose credential is revoked, or an operator whose dashboard
session ends, stops receiving within one keep-alive interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Literal, TypeVar

T = TypeVar("T")


class Tick(enum.Enum):
    """What `rechecked` yields between items: the check passed, send a keep-alive."""

    KEEP_ALIVE = "keep-alive"


class HeldStreams:
    """The registry every held response joins by wrapping its body in `hold`."""

    def __init__(self) -> None:
        # Bound to the serving loop on first use, not here (create_app runs before it).
        self._closing = asyncio.Event()
        self._open = 0

    @property
    def open(self) -> int:
        return self._open

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    def close_all(self) -> None:
        """End every held stream now, and every one that opens from now on at once."""
        self._closing.set()

    async def hold(self, stream: AsyncGenerator[T, None]) -> AsyncIterator[T]:
        """stream's items until it ends, or until close_all; then stream is closed (its
        finally blocks run) and the response ends normally."""
        if self._closing.is_set():
            await stream.aclose()
            return
        self._open += 1
        closing = asyncio.ensure_future(self._closing.wait())
        step: asyncio.Future[T] | None = None
        try:
            while True:
                step = asyncio.ensure_future(anext(stream))
                await asyncio.wait({step, closing}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    return
                try:
                    item = step.result()
                except StopAsyncIteration:
                    return
                step = None
                yield item
        finally:
            self._open -= 1
            closing.cancel()
            if step is not None and not step.done():
                # Interrupts the stream where it waits; it then runs its finally blocks.
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await step
            # Unless that wait was itself cancelled: the stream still runs in `step`
            # then, and ends there by the cancel above.
            if step is None or step.done():
                await stream.aclose()


async def rechecked(
    next_item: Callable[[], Awaitable[T]],
    keepalive_s: float,
    admitted: Callable[[], Awaitable[bool]],
) -> AsyncGenerator[T | Literal[Tick.KEEP_ALIVE], None]:
    """next_item()'s items as they come, and Tick.KEEP_ALIVE every keepalive_s once
    admitted() says the stream's credential still holds; ends the first time it does not.
    Due by the clock, not by silence: a busy stream is re-checked as often as a quiet one.
    """
    loop = asyncio.get_running_loop()
    check_at = loop.time() + keepalive_s
    while True:
        with contextlib.suppress(TimeoutError):
            item = await asyncio.wait_for(next_item(), max(0.0, check_at - loop.time()))
            yield item
        if loop.time() < check_at:
            continue
        if not await admitted():
            return
        yield Tick.KEEP_ALIVE
        check_at = loop.time() + keepalive_s
