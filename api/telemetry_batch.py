"""Group commit of telemetry: the samples of cached nodes decided and written together.

A fleet sends one telemetry sample per node every 20 s; as one transaction each (two
statements and a commit) they were most of the API's and PostgreSQL's work at a few
thousand nodes. Here a sample from a node in the node cache (api/agent/fast_path.py)
joins the next batch and its request waits for that batch's commit: every sample that
arrives while a batch is being written goes into the next one, so an idle API writes a
sample at once (a batch of one) and a busy one writes hundreds per transaction, with
no timer and no added delay beyond the batch in flight.

The rules are the single sample's (store/ingest.py: step, ingest_telemetry_batch):
the same decisions, replays answered 409 each, one not-applied event per episode, the
server-received time the database clock when the batch locked the rows. A batch that
fails (the database down) fails every request in it, each with the same error a single
sample would have had; nothing of it is written. A request whose client went away
still has its sample written with the batch it joined.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.background import background
from api.metrics import ApiMetrics
from schemas.agent import IngestResult, TelemetryReport
from store.ingest import Sample, ingest_telemetry_batch

logger = logging.getLogger("modelforge.api.telemetry")

# Samples per transaction at most (the rows it locks, the statement's parameters).
MAX_BATCH = 500


@dataclass
class _Waiting:
    sample: Sample
    answer: asyncio.Future[IngestResult]


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
        self._waiting: list[_Waiting] = []
        self._arrived = asyncio.Event()

    async def ingest(self, node_id: uuid.UUID, report: TelemetryReport) -> IngestResult:
        """The sample's outcome once its batch committed; raises what a single sample
        would (a replay's Conflict, the database's error)."""
        answer: asyncio.Future[IngestResult] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(Sample(node_id, report), answer))
        self._arrived.set()
        return await answer

    async def run(self) -> None:
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            while self._waiting:
                batch = self._waiting[:MAX_BATCH]
                del self._waiting[:MAX_BATCH]
                await self._write(batch)

    async def _write(self, batch: list[_Waiting]) -> None:
        try:
            async with self._sessions() as session, session.begin():
                outcomes = await ingest_telemetry_batch(
                    session,
                    [waiting.sample for waiting in batch],
                    future_skew_limit_s=self._future_skew_limit_s,
                )
        except Exception as exc:  # every request of the batch answers with it
            for waiting in batch:
                if not waiting.answer.done():
                    waiting.answer.set_exception(exc)
            return
        self._metrics.telemetry_batches.inc()
        self._metrics.telemetry_batched.inc(len(batch))
        for waiting, outcome in zip(batch, outcomes, strict=True):
            if waiting.answer.done():
                continue  # its request was cancelled (the client went away)
            if isinstance(outcome, Exception):
                waiting.answer.set_exception(outcome)
            else:
                waiting.answer.set_result(outcome)


@contextlib.asynccontextmanager
async def telemetry_batcher(
    sessions: async_sessionmaker[AsyncSession], future_skew_limit_s: float, metrics: ApiMetrics
) -> AsyncIterator[TelemetryBatcher]:
    """The batcher and its writer task, for the lifespan of the API process."""
    batcher = TelemetryBatcher(sessions, future_skew_limit_s, metrics)
    async with background(batcher.run(), "telemetry-batches"):
        yield batcher
