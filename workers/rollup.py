"""The per-minute rollup (store/rollup/): two periodic entries (workers/main.py:
schedule). `rollup_minute`, every few seconds, writes the fleet's counts as the current
minute's row and copies the nodes' recent telemetry into their minutes; `rollup_prune`
deletes what is past retention, in bounded batches.

Both are idempotent, as every periodic actor is (a period's message is sent once, but a
run may repeat or overlap another worker's): the fleet row is overwritten with absolute
counts, the node rows with the same samples, and a pruned row is deleted once. The
gateway's usage is added by the API processes themselves (api/gateway/usage.py).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from store.rollup import fleet, nodes
from store.rollup.retention import Retention, prune

logger = logging.getLogger("modelforge.workers.rollup")


class RollupSettings(BaseSettings):
    """The rollup's schedule and retention (part of WorkerSettings)."""

    model_config = SettingsConfigDict(env_prefix="MODELFORGE_", extra="ignore")

    # Usage and fleet minutes are kept this long; node minutes (the sparklines) this.
    # The node panel draws the last hour; a node minute per node is 10,000 rows a minute
    # at fleet scale (about 2.5 GB a day with indexes), so a little over an hour is kept.
    rollup_retention_days: float = Field(default=30.0, gt=0)
    node_rollup_retention_h: float = Field(default=2.0, gt=0)
    # Under 20 s (a node's telemetry period) so that each sample is copied, and under
    # 60 s so that every minute has its fleet row.
    rollup_period_s: float = Field(default=15.0, gt=0, le=30)
    rollup_prune_period_s: float = Field(default=300.0, gt=0)

    def rollup_retention(self) -> Retention:
        days = timedelta(days=self.rollup_retention_days)
        return Retention(
            usage=days, fleet=days, nodes=timedelta(hours=self.node_rollup_retention_h)
        )


async def rollup_minute(sessions: async_sessionmaker[AsyncSession]) -> None:
    """The fleet's row of this minute, then the nodes' minutes (each its own
    transaction: a slow copy of 10,000 nodes' telemetry never holds the fleet row)."""
    async with sessions() as session, session.begin():
        await fleet.record(session)
    async with sessions() as session, session.begin():
        await nodes.record(session)


async def rollup_prune(
    sessions: async_sessionmaker[AsyncSession], retention: Retention
) -> dict[str, int]:
    deleted = await prune(sessions, retention)
    if any(deleted.values()):
        logger.info("rollup: rows past retention deleted: %s", deleted)
    return deleted
