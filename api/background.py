"""A task that lives as long as a block of the API's lifespan (api/app.py): started on
entry, cancelled and awaited on exit, so nothing outlives the process's shutdown."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any


@contextlib.asynccontextmanager
async def background(work: Coroutine[Any, Any, None], name: str) -> AsyncIterator[None]:
    task = asyncio.create_task(work, name=name)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
