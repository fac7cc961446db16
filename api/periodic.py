"""A periodic writer's loop (the heartbeat buffer, the gateway's usage and measurements)
run for the span of a lifespan: started on entry, told to stop on exit and awaited, so
that its last window is written before the lifespan goes on to close the database."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any


@contextlib.asynccontextmanager
async def running(
    run: Callable[[asyncio.Event], Coroutine[Any, Any, None]], name: str
) -> AsyncIterator[None]:
    """`run(stop)` as a task named `name` until the block ends; then `stop` is set and
    the task awaited (its own errors are its to handle: one that escapes is raised here)."""
    stop = asyncio.Event()
    task = asyncio.create_task(run(stop), name=name)
    try:
        yield
    finally:
        stop.set()
        await task
