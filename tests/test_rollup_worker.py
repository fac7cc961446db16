"""The rollup's periodic actors (workers/rollup.py, workers/actors.py: rollup_minute,
rollup_prune) in two real worker processes at once: the fleet's row of the minute and
the nodes' telemetry minutes are written (one row a minute, however many workers), and
rows past retention are pruned."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from store.rollup.tables import FleetMinute, NodeMinute
from tests.rollup_flows import expected, seed_fleet
from tests.worker_processes import Workers

T = TypeVar("T")
NODES = 20


async def until(check: Callable[[], Awaitable[T | None]], what: str, timeout_s: float = 60) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        found = await check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def test_two_workers_write_the_minutes_and_prune_the_old(
    workers: Workers, sessions: async_sessionmaker[AsyncSession]
) -> None:
    await seed_fleet(sessions, NODES, "w")
    old = {"minute": timedelta(days=40)}
    async with sessions() as session, session.begin():
        await session.execute(
            text(
                "INSERT INTO fleet_minutes (minute, nodes, gpus, gpu_memory_total_bytes,"
                " gpu_memory_used_bytes, deployments, services)"
                " VALUES (date_trunc('minute', now() - CAST(:minute AS interval)),"
                " '{}', 0, 0, 0, '{}', '{}')"
            ),
            old,
        )
    # The seeded heartbeats agree with the default thresholds (tests/rollup_flows.py);
    # the workers' liveness sweep must not move a node while the minute is counted.
    workers.env["MODELFORGE_STALE_AFTER_S"] = "30"
    workers.env["MODELFORGE_OFFLINE_AFTER_S"] = "90"
    workers.env["MODELFORGE_ROLLUP_PERIOD_S"] = "0.5"
    workers.env["MODELFORGE_ROLLUP_PRUNE_PERIOD_S"] = "1"
    workers.start(2)

    async def written() -> list[FleetMinute]:
        async with sessions() as session:
            rows = (await session.execute(select(FleetMinute))).scalars().all()
        return [row for row in rows if row.gpus > 0]

    [row, *_] = await until(written, "the fleet's row of this minute")
    assert row.nodes == expected(NODES).nodes and row.gpus == expected(NODES).gpus

    async def copied() -> int:
        async with sessions() as session:
            found = await session.execute(select(func.count()).select_from(NodeMinute))
        return int(found.scalar_one())

    assert await until(copied, "the nodes' minutes") == NODES

    async def pruned() -> bool:
        async with sessions() as session:
            oldest = (await session.execute(select(func.min(FleetMinute.minute)))).scalar_one()
            now = (await session.execute(select(func.now()))).scalar_one()
        return oldest is not None and now - oldest < timedelta(days=1)

    await until(pruned, "the 40-day-old row pruned")
