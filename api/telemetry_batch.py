"""Group commit of telemetry: the samples of cached nodes decided and written together.

A fleet sends one telemetry sample per node every 20 s; as one transaction each (two
statements and a commit) they were most of the API's and PostgreSQL's work at a few
thousand nodes. Here a sample from a node in the node cache (api/agent/fast_path.py)
joins the next batch (api/group_commit.py) and its request waits for that batch's
commit.

The rules are the single sample's (store/ingest.py: step, ingest_telemetry_batch):
the same decisions, replays answered 409 each, one not-applied event per episode, the
server-received time the database clock when the batch locked the rows. A batch that
fails (the database down) fails every request in it, each with the same error a single
sample would have had; nothing of it is written. A request whose client went away
still has its sample written with the batch it joined.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.background import background
from api.group_commit import GroupCommit
from api.metrics import ApiMetrics
from schemas.agent import IngestResult, TelemetryReport
from store.ingest import Sample, ingest_telemetry_batch

MAX_BATCH = 500


class TelemetryBatcher:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        future_skew_limit_s: float,
        metrics: ApiMetrics,
    ) -> None:
        self._sessions = sessions
        self._metrics = metrics
        self._future_skew_limit_s = future_skew_limit_s
        self.group: GroupCommit[Sample, IngestResult] = GroupCommit(self._write, MAX_BATCH)

    async def ingest(self, node_id: uuid.UUID, report: TelemetryReport) -> IngestResult:
        """The sample's outcome once its batch committed; raises what a single sample
        would (a replay's Conflict, the database's error)."""
        return await self.group.submit(Sample(node_id, report))

    async def _write(self, samples: list[Sample]) -> Sequence[IngestResult | Exception]:
        async with self._sessions() as session, session.begin():
            outcomes = await ingest_telemetry_batch(
                session, samples, future_skew_limit_s=self._future_skew_limit_s
            )
        self._metrics.telemetry_batches.inc()
        self._metrics.telemetry_batched.inc(len(samples))
        return outcomes


@contextlib.asynccontextmanager
async def telemetry_batcher(
    sessions: async_sessionmaker[AsyncSession], future_skew_limit_s: float, metrics: ApiMetrics
) -> AsyncIterator[TelemetryBatcher]:
    """The batcher and its writer task, for the lifespan of the API process."""
    batcher = TelemetryBatcher(sessions, future_skew_limit_s, metrics)
    async with background(batcher.group.run(), "telemetry-batches"):
        yield batcher
