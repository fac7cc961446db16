"""Group commit of routine heartbeats: `last_heartbeat_at` for many nodes in one UPDATE.

A routine heartbeat (cached credential, node online, nothing new: api/agent/heartbeat.py)
is only noted here, with the monotonic time it arrived, and answered. Every
`flush_interval_s` one statement writes all of them (store/heartbeat.py: write_routine),
each as the database's own clock minus the time since it arrived, so liveness stays
decided from server-received time on the database clock, whatever this host's clock says.

What a crash costs: the heartbeats of the last interval not yet flushed. They can never
turn into a false stale or offline as long as the interval is far below the stale
threshold (enforced in settings): the node's previous heartbeat was flushed at most an
interval plus its heartbeat period earlier, and its next one lands on whichever API
answers it. A timestamp is never moved backwards (a heartbeat that took the
transactional path meanwhile wins).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from prometheus_client import Counter
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.periodic import Outage, repeat, running
from store import heartbeat

logger = logging.getLogger("modelforge.api.heartbeats")


class HeartbeatBuffer:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        flush_interval_s: float,
        flushed: Counter,
    ) -> None:
        self._sessions = sessions
        self.flush_interval_s = flush_interval_s
        self._pending: dict[uuid.UUID, float] = {}
        # Database clock minus this host's wall clock, from the last database answer.
        self._offset_s: float | None = None
        self.flushed = flushed

    @property
    def ready(self) -> bool:
        """True once the database clock is known: until then heartbeats take the
        transactional path, which also teaches it."""
        return self._offset_s is not None

    def observe(self, database_now: datetime) -> None:
        self._offset_s = database_now.timestamp() - time.time()

    def database_now(self) -> datetime:
        return datetime.fromtimestamp(time.time() + (self._offset_s or 0.0), tz=UTC)

    def note(self, node_id: uuid.UUID) -> datetime:
        """Record a routine heartbeat; its server-received time (database clock)."""
        self._pending[node_id] = time.monotonic()
        return self.database_now()

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def flush(self) -> int:
        if not self._pending:
            return 0
        batch, self._pending = self._pending, {}
        now = time.monotonic()
        ids = list(batch)
        ages = [max(0.0, now - batch[i]) for i in ids]
        try:
            async with self._sessions() as session, session.begin():
                written = await heartbeat.write_routine(session, ids, ages)
        except BaseException:
            # Keep them for the next round, unless a newer heartbeat of the node came.
            for node_id, at in batch.items():
                self._pending.setdefault(node_id, at)
            raise
        self.observe(written.now)
        self.flushed.inc(len(ids))
        return written.written

    async def run(self, stop: asyncio.Event) -> None:
        outage = Outage(logger, "heartbeat flush", "succeeds again")
        await repeat(self.flush, stop, self.flush_interval_s, outage, after_stop=True)


@contextlib.asynccontextmanager
async def heartbeat_buffer(
    sessions: async_sessionmaker[AsyncSession], flush_interval_s: float, flushed: Counter
) -> AsyncIterator[HeartbeatBuffer]:
    """Flushing every interval for the lifespan; a last flush at shutdown."""
    buffer = HeartbeatBuffer(sessions, flush_interval_s, flushed)
    try:
        async with running(buffer.run, "heartbeat-buffer"):
            yield buffer
    finally:
        with contextlib.suppress(SQLAlchemyError, OSError):
            await buffer.flush()
