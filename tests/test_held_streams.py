"""Held streams end when the API begins to stop (api/held_streams.py): a stream waiting
for its next item ends at once, its cleanup runs, and one opened afterwards ends at
once; until then items pass through unchanged. The end to end tests (a real API and a
real `up` stopped while an agent holds its channel) are in test_job_notifications.py and
test_up_stopping.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from api.held_streams import HeldStreams

pytestmark = pytest.mark.fast


async def test_a_waiting_stream_ends_at_close_all_and_cleans_up() -> None:
    held = HeldStreams()
    cleaned = asyncio.Event()

    async def forever() -> AsyncGenerator[str, None]:
        try:
            yield "connected"
            await asyncio.Event().wait()
            yield "never"
        finally:
            cleaned.set()

    seen: list[str] = []

    async def consume() -> None:
        async for item in held.hold(forever()):
            seen.append(item)

    task = asyncio.create_task(consume())
    while held.open == 0 or not seen:
        await asyncio.sleep(0.01)
    held.close_all()
    await asyncio.wait_for(task, 2)
    assert seen == ["connected"]
    assert cleaned.is_set()
    assert held.open == 0


async def test_a_stream_opened_while_closing_ends_at_once() -> None:
    held = HeldStreams()
    held.close_all()
    started = False

    async def stream() -> AsyncGenerator[str, None]:
        nonlocal started
        started = True
        yield "never"

    assert [item async for item in held.hold(stream())] == []
    assert not started and held.closing


async def test_a_stream_that_ends_by_itself_passes_through() -> None:
    held = HeldStreams()

    async def three() -> AsyncGenerator[int, None]:
        for i in range(3):
            yield i

    assert [item async for item in held.hold(three())] == [0, 1, 2]
    assert held.open == 0 and not held.closing


async def test_a_client_that_goes_away_closes_the_stream() -> None:
    """The response's task is cancelled when its client disconnects."""
    held = HeldStreams()
    cleaned = asyncio.Event()

    async def forever() -> AsyncGenerator[str, None]:
        try:
            await asyncio.Event().wait()
            yield "never"
        finally:
            cleaned.set()

    async def consume() -> None:
        async for _ in held.hold(forever()):
            pass

    task = asyncio.create_task(consume())
    while held.open == 0:
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.wait_for(cleaned.wait(), 2)
    assert held.open == 0 and not held.closing
