"""Held streams (the agents' notification channels, the gateway's SSE streams to come)
end when the API begins to stop.

uvicorn stops in this order: it stops accepting, waits for every open connection to
finish, and only then runs the lifespan's shutdown. A held stream never finishes by
itself, so without this the API would wait until whoever stops it gives up and kills it
(43 s under `modelforge up`), and the agents would see a broken connection rather than
an ended stream. api/server.py calls `close_all` as uvicorn's shutdown begins (after
the listeners close, so a client that reconnects at once reaches another replica); every
stream wrapped in `hold` then ends at its next step, and the response completes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

T = TypeVar("T")


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
