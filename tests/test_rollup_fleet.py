"""The fleet and node rollup (store/rollup/fleet.py, nodes.py, retention.py) against
real PostgreSQL: the overview's counts of a fleet of every liveness (disabled and
decommissioned nodes, missing GPUs, services of every health), the minute's row written
by several workers at once (one row, the right counts), the nodes' telemetry copied into
their minutes (maxima kept across samples, the same rows from concurrent runs), and
retention pruning in batches."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from schemas.usage import empty_buckets
from store.models import NodeStream
from store.rollup import fleet, nodes, usage
from store.rollup.retention import Retention, prune
from store.rollup.tables import FleetMinute, NodeMinute, UsageMinute
from store.rollup.usage import UsageDelta
from tests.rollup_flows import expected, node_id, seed_fleet, seed_services

NODES = 200
TAG = "f"


@pytest.fixture
async def seeded(sessions: async_sessionmaker[AsyncSession]) -> dict[str, int]:
    await seed_fleet(sessions, NODES, TAG)
    return await seed_services(sessions, TAG, [5, 6, 7, 8, 9, 12])


async def test_counts_the_fleet_by_liveness_gpus_and_service_health(
    sessions: async_sessionmaker[AsyncSession], seeded: dict[str, int]
) -> None:
    async with sessions() as session:
        found = await fleet.counts(session)
    want = expected(NODES)
    assert found.nodes == want.nodes
    assert (found.gpus, found.gpu_memory_total_bytes) == (want.gpus, want.gpu_memory_total_bytes)
    assert found.gpu_memory_used_bytes == want.gpu_memory_used_bytes
    assert found.gpu_utilization_percent == pytest.approx(want.gpu_utilization_percent)
    assert found.services == seeded
    assert set(found.deployments.values()) == {0}


async def test_concurrent_workers_leave_one_row_a_minute_with_the_counts(
    sessions: async_sessionmaker[AsyncSession], seeded: dict[str, int]
) -> None:
    async def write() -> datetime:
        async with sessions() as session, session.begin():
            return await fleet.record(session)

    written = await asyncio.wait_for(asyncio.gather(*(write() for _ in range(6))), 60)
    async with sessions() as session:
        rows = (await session.execute(select(FleetMinute))).scalars().all()
    # Six writers straddling a minute boundary leave two rows, never more.
    assert len(rows) == len(set(written)) <= 2
    row = rows[-1]
    assert row.minute.second == 0 and row.minute.microsecond == 0
    assert row.nodes == expected(NODES).nodes and row.services == seeded
    # The history keys the row by its step and keeps the last of the step.
    async with sessions() as session:
        found = await fleet.history(
            session, row.minute - timedelta(minutes=5), row.minute + timedelta(minutes=1), 300
        )
    assert [counts.gpus for counts in found.values()] == [expected(NODES).gpus]


async def test_nodes_telemetry_is_copied_into_its_minute_keeping_the_maxima(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    await seed_fleet(sessions, 3, TAG)
    one = node_id(TAG, 1)

    async def copy() -> int:
        async with sessions() as session, session.begin():
            return await nodes.record(session)

    written = await asyncio.wait_for(asyncio.gather(*(copy() for _ in range(4))), 60)
    assert written == [3, 3, 3, 3]
    # A later sample of the same minute: its GPUs cooler and less busy.
    here = (NodeStream.node_id == one) & (NodeStream.stream == "telemetry")
    async with sessions() as session, session.begin():
        stream = (await session.execute(select(NodeStream).where(here))).scalar_one()
        assert stream.good_payload is not None and stream.good_received_at is not None
        payload = dict(stream.good_payload)
        payload["gpus"][0].update(utilization_percent=0, temperature_c=20)
        payload["gpus"][1].update(utilization_percent=10)
        payload["ram_used_bytes"] = 5
        received = stream.good_received_at
        later = max(received, min(received + timedelta(seconds=1), received.replace(second=59)))
        await session.execute(
            update(NodeStream).where(here).values(good_payload=payload, good_received_at=later)
        )
    await copy()
    async with sessions() as session:
        rows = (
            (await session.execute(select(NodeMinute).where(NodeMinute.node_id == one)))
            .scalars()
            .all()
        )
    [row] = rows
    assert row.ram_used_bytes == 5 and row.ram_total_bytes == 64 << 30
    # The last sample's mean; the highest GPU of either sample.
    assert row.gpu_utilization_percent == pytest.approx(5.0)
    assert row.gpu_utilization_max_percent == 50
    assert row.gpu_temperature_max_c == 41
    assert row.gpu_memory_used_bytes == (1 << 30) + (1 << 30)
    assert row.gpu_power_w == 150
    async with sessions() as session:
        history = await nodes.history(
            session, one, row.minute - timedelta(hours=1), row.minute + timedelta(minutes=1), 60
        )
    assert list(history) == [row.minute]
    assert history[row.minute].ram_used_bytes == 5


async def test_retention_prunes_old_rows_in_batches(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    async with sessions() as session:
        now = (await session.execute(select(func.statement_timestamp()))).scalar_one()
    now = now.astimezone(UTC).replace(second=0, microsecond=0)
    client = uuid.uuid4()
    deltas = [
        UsageDelta(now - timedelta(minutes=m), client, "m", "ok", 1, 1, 1, 0, 0.0, empty_buckets())
        for m in range(0, 60 * 30, 10)  # 180 rows over 30 hours
    ]
    async with sessions() as session, session.begin():
        await usage.add(session, deltas)
        for m in range(0, 60 * 30, 10):
            minute = {"node": client, "minute": now - timedelta(minutes=m)}
            await session.execute(
                text("INSERT INTO node_minutes (node_id, minute) VALUES (:node, :minute)"),
                minute,
            )
            await session.execute(
                text(
                    "INSERT INTO fleet_minutes (minute, nodes, gpus, gpu_memory_total_bytes,"
                    " gpu_memory_used_bytes, deployments, services)"
                    " VALUES (:minute, '{}', 0, 0, 0, '{}', '{}')"
                ),
                minute,
            )
    retention = Retention(
        usage=timedelta(hours=24), fleet=timedelta(hours=24), nodes=timedelta(hours=2)
    )
    deleted = await prune(sessions, retention, batch_size=7, max_batches=3)
    # At most three batches of seven a table a run; the next run goes on.
    assert deleted == {"usage_minutes": 21, "fleet_minutes": 21, "node_minutes": 21}
    while any((await prune(sessions, retention, batch_size=7, max_batches=3)).values()):
        pass
    async with sessions() as session:
        for table, kept in ((UsageMinute, 144), (FleetMinute, 144), (NodeMinute, 12)):
            counted = await session.execute(select(func.count()).select_from(table))
            assert counted.scalar_one() == kept, table
