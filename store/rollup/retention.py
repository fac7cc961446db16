"""The rollup's retention: rows older than their table's retention are deleted in
batches that commit on their own (a long backlog never holds one long transaction), at
most a bounded number of batches a run; the next run goes on. Any number of workers may
prune at once: a row two of them pick is deleted once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

# The tables and the column their age is read from (fixed names, never input).
USAGE = "usage_minutes"
FLEET = "fleet_minutes"
NODES = "node_minutes"
_TABLES = (USAGE, FLEET, NODES)


@dataclass(frozen=True)
class Retention:
    usage: timedelta
    fleet: timedelta
    nodes: timedelta

    def of(self, table: str) -> timedelta:
        return {USAGE: self.usage, FLEET: self.fleet, NODES: self.nodes}[table]


async def prune_batch(session: AsyncSession, table: str, keep: timedelta, limit: int) -> int:
    """Delete at most `limit` rows of `table` older than `keep` (database clock)."""
    if table not in _TABLES:
        raise ValueError(f"not a rollup table: {table}")
    done = await session.execute(
        text(
            f"""
            DELETE FROM {table} WHERE ctid IN (
                SELECT ctid FROM {table}
                WHERE minute < statement_timestamp() - CAST(:keep AS interval)
                LIMIT :limit FOR UPDATE SKIP LOCKED)
            """  # noqa: S608
        ),
        {"keep": keep, "limit": limit},
    )
    return int(done.rowcount or 0)  # type: ignore[attr-defined]


async def prune(
    sessions: async_sessionmaker[AsyncSession],
    retention: Retention,
    *,
    batch_size: int = 5_000,
    max_batches: int = 20,
) -> dict[str, int]:
    """Prune every rollup table; how many rows each lost."""
    deleted: dict[str, int] = {}
    for table in _TABLES:
        total = 0
        for _ in range(max_batches):
            async with sessions() as session, session.begin():
                count = await prune_batch(session, table, retention.of(table), batch_size)
            total += count
            if count < batch_size:
                break
        deleted[table] = total
    return deleted
