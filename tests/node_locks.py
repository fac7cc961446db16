"""Holding a node's lock from a session of the test's own: a request that must take it
(a returning node's heartbeat records its liveness event under it) waits in flight
until the test lets go."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from store.locks import node_xact_lock

HoldNodeLock = Callable[[str], Awaitable[asyncio.Event]]


async def _holding_node_lock(
    sessions: async_sessionmaker[AsyncSession],
    node_id: str,
    held: asyncio.Event,
    release: asyncio.Event,
) -> None:
    async with sessions() as session, session.begin():
        await session.execute(select(node_xact_lock(uuid.UUID(node_id))))
        held.set()
        await release.wait()


@pytest.fixture
async def lock_holder(
    sessions: async_sessionmaker[AsyncSession],
) -> AsyncIterator[Callable[[str], Awaitable[asyncio.Event]]]:
    """Hold a node's lock from a session of the test's own until the event is set."""
    tasks: list[asyncio.Task[None]] = []
    releases: list[asyncio.Event] = []

    async def hold(node_id: str) -> asyncio.Event:
        held, release = asyncio.Event(), asyncio.Event()
        releases.append(release)
        tasks.append(asyncio.create_task(_holding_node_lock(sessions, node_id, held, release)))
        await asyncio.wait_for(held.wait(), 20)
        return release

    yield hold
    for release in releases:
        release.set()
    await asyncio.gather(*tasks)
