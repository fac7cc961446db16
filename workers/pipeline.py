"""The event pipeline of a worker process: the outbox relay and the stream consumers.

outbox (PostgreSQL) → relay → JetStream → audit consumer    → audit_log
                                        → reconcile consumer → GPUs, node view

Every worker process runs all of it on its actors' event loop (workers/services.py);
any number of processes may, since the relays take turns and the consumers are durable
and shared. Tests run the same `Pipeline` in a thread beside an in-process API.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from functools import partial

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from broker.streams import StreamSpec, events_stream
from store.notify import OUTBOX_CHANNEL, listening
from workers import audit, reconcile
from workers.consumer import EventConsumer
from workers.metrics import PipelineMetrics
from workers.relay import OutboxRelay, connect_nats


@dataclass(frozen=True)
class PipelineSettings:
    nats_url: str
    relay: bool = True
    consumers: bool = True
    relay_batch_size: int = 200
    relay_poll_interval_s: float = 1.0
    consumer_batch_size: int = 200
    consumer_ack_wait_s: float = 30.0
    # The events stream as the relay and the consumers declare it (replicas, placement).
    stream: StreamSpec = field(default_factory=events_stream)


class Pipeline:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        database_url: str,
        settings: PipelineSettings,
        metrics: PipelineMetrics | None = None,
    ) -> None:
        self.settings = settings
        self._database_url = database_url
        connect = partial(connect_nats, settings.nats_url)
        self.relay = OutboxRelay(
            sessions, connect, batch_size=settings.relay_batch_size, stream=settings.stream
        )
        self.consumers: list[EventConsumer] = []
        if settings.consumers:
            self.consumers = [
                EventConsumer(
                    kind.DURABLE,
                    kind.FILTER,
                    kind.handler(sessions),
                    connect,
                    batch_size=settings.consumer_batch_size,
                    ack_wait_s=settings.consumer_ack_wait_s,
                    metrics=metrics,
                    stream=settings.stream,
                )
                for kind in (audit, reconcile)
            ]

    async def _relay(self, stop: asyncio.Event) -> None:
        try:
            async with listening(self._database_url, OUTBOX_CHANNEL) as wake:
                await self.relay.run(stop, self.settings.relay_poll_interval_s, wake)
        finally:
            await self.relay.close()

    async def run(self, stop: asyncio.Event) -> None:
        """Until stop is set. A task that fails on a bug ends the others too."""
        tasks = [consumer.run(stop) for consumer in self.consumers]
        if self.settings.relay:
            tasks.append(self._relay(stop))
        async with asyncio.TaskGroup() as group:
            for task in tasks:
                group.create_task(task)
