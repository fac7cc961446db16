"""A node's held notification request (GET NOTIFICATIONS), as the agent holds it, or its
runtime channel as the runtime worker does: for the tests of job notifications, of
stopping an API or `up` while a channel is open, and of a runtime worker's loss."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from schemas.protocol import NOTIFICATIONS


@dataclass
class Channel:
    notes: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    # Set only when the server ends the stream properly, not when the connection breaks.
    closed: asyncio.Event = field(default_factory=asyncio.Event)


@contextlib.asynccontextmanager
async def channel(
    base_url: str, credential: str, path: str = NOTIFICATIONS
) -> AsyncIterator[Channel]:
    """The node's held notification request (or its runtime channel: `path`); its
    `event: job` payloads, in order. Leaving the block breaks the connection, as a
    killed process's does."""
    held = Channel()

    async def hold() -> None:
        # Reads may wait for a keep-alive between notifications.
        timeout = httpx.Timeout(10.0, read=60.0)
        async with httpx.AsyncClient(base_url=base_url, timeout=timeout) as client:
            headers = {"Authorization": f"Bearer {credential}"}
            async with client.stream("GET", path, headers=headers) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                event = None
                async for line in response.aiter_lines():
                    held.opened.set()
                    if line.startswith("event: "):
                        event = line.removeprefix("event: ")
                    elif line.startswith("data: ") and event == "job":
                        await held.notes.put(json.loads(line.removeprefix("data: ")))
        held.closed.set()

    task = asyncio.create_task(hold())
    await asyncio.wait_for(held.opened.wait(), 10)
    try:
        yield held
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
