"""Group commit of returning nodes' heartbeats: the return storm made cheap.

A node the node cache does not hold (it was stale or offline, it just enrolled, or this
API process just started without it) takes the transactional path with its heartbeat.
One at a time that is six statements and a commit per node; when a whole fleet comes
back at once (after an outage of the API or the network), those transactions queued
behind each other until heartbeats timed out and more nodes went stale. Here they join
one batch (api/group_commit.py) decided by the store's rule (store/heartbeat.py:
record_returns): the node locks free now, the credentials, one UPDATE and the liveness events,
for hundreds of nodes per commit.

A heartbeat the batch does not decide (a credential it would refuse, new agent facts,
a second heartbeat of a node already in the batch) and every heartbeat of a batch that
failed is decided alone by the single path (api/agent/heartbeat.py), which gives the
typed answer: the batch only ever answers what that path would have answered 200.
After the commit each node is cached, as the single path does, unless a change
notification arrived since the batch began (api/node_cache.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.background import background
from api.group_commit import GroupCommit
from api.heartbeat_buffer import HeartbeatBuffer
from api.metrics import ApiMetrics
from api.node_cache import NodeCache, cache_entry
from schemas.agent import HeartbeatRequest, HeartbeatResponse
from store import heartbeat
from store.heartbeat import Returning
from store.secrets import PresentedSecret, digest

logger = logging.getLogger("modelforge.api.returns")

MAX_BATCH = 500


class ReturnBatcher:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        cache: NodeCache | None,
        heartbeats: HeartbeatBuffer,
        heartbeat_interval_s: float,
        metrics: ApiMetrics,
    ) -> None:
        self._sessions = sessions
        # None: the node cache is off (ApiSettings.heartbeat_cache), nothing is cached.
        self._cache = cache
        self._heartbeats = heartbeats
        self._interval_s = heartbeat_interval_s
        self._metrics = metrics
        self.group: GroupCommit[Returning, HeartbeatResponse | None] = GroupCommit(
            self._write, MAX_BATCH
        )

    async def heartbeat(
        self, presented: PresentedSecret, request: HeartbeatRequest
    ) -> HeartbeatResponse | None:
        """The answer once the heartbeat's batch committed, or None: decide it alone."""
        try:
            return await self.group.submit(Returning(presented, request))
        except Exception:
            # The single path meets the same failure (the database down) and answers
            # it typed; the batch's error is not this request's to report.
            logger.warning("a batch of returning heartbeats failed", exc_info=True)
            return None

    async def _write(self, returning: list[Returning]) -> Sequence[HeartbeatResponse | None]:
        generation = self._cache.generation if self._cache is not None else 0
        async with self._sessions() as session, session.begin():
            decided = await heartbeat.record_returns(session, returning)
        answers: list[HeartbeatResponse | None] = []
        for item, node in zip(returning, decided, strict=True):
            if node is None:
                answers.append(None)
                continue
            answers.append(heartbeat.answer(node.node_id, node.received_at, self._interval_s))
            if self._cache is not None:
                entry = cache_entry(node, digest(item.presented.secret), item.request)
                self._cache.remember(entry, generation)
        written = [node for node in decided if node is not None]
        if written:
            self._heartbeats.observe(written[0].received_at)
        self._metrics.return_batches.inc()
        self._metrics.returns_batched.inc(len(written))
        return answers


@contextlib.asynccontextmanager
async def return_batcher(
    sessions: async_sessionmaker[AsyncSession],
    cache: NodeCache | None,
    heartbeats: HeartbeatBuffer,
    heartbeat_interval_s: float,
    metrics: ApiMetrics,
) -> AsyncIterator[ReturnBatcher]:
    """The batcher and its writer task, for the lifespan of the API process."""
    batcher = ReturnBatcher(sessions, cache, heartbeats, heartbeat_interval_s, metrics)
    async with background(batcher.group.run(), "return-batches"):
        yield batcher
