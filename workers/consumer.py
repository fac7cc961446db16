"""Durable consumers of the event stream, shared by every worker replica.

Each consumer is one durable JetStream pull consumer (explicit acks): any number of
worker processes bind to it and the server hands each batch to one of them. A batch is
handled in one database transaction and acked only after it commits, so a worker that
dies mid-batch leaves its messages to be redelivered to another one after ack_wait.
Handlers must therefore be idempotent (audit: by event id; reconcile: from the stored
state), and then delivery at least once means effect exactly once.

Retries, as in the relay: one loop. A broker failure drops the connection and the next
round connects afresh; a database outage naks the batch with a delay. An event the
handler refuses on its own (a statement error, not an outage) is retried alone, and if
it still fails it is logged and terminated, so one bad event never blocks the stream.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from broker.streams import StreamSpec, declare, events_stream
from schemas.events import CloudEvent
from schemas.protocol import EVENTS_STREAM
from store.engine import database_down
from workers.metrics import PipelineMetrics
from workers.relay import BROKER_ERRORS, Connect, close_quietly, wait_or_stop

logger = logging.getLogger("modelforge.consumers")

# Handles a batch in one transaction (it opens and commits it); raises to refuse it.
Handler = Callable[[Sequence[CloudEvent]], Awaitable[None]]


@dataclass
class EventConsumer:
    durable: str
    filter_subject: str
    handle: Handler
    connect: Connect
    batch_size: int = 200
    ack_wait_s: float = 30.0
    fetch_timeout_s: float = 1.0
    max_backoff_s: float = 2.0
    metrics: PipelineMetrics | None = None
    # Declared on every new connection (replicas and placement from the settings);
    # the durable consumer has no replicas of its own, so it inherits the stream's.
    stream: StreamSpec = field(default_factory=events_stream)
    terminated: int = field(default=0, init=False)
    _nc: NatsClient | None = field(default=None, init=False, repr=False)
    _sub: JetStreamContext.PullSubscription | None = field(default=None, init=False, repr=False)

    def config(self) -> ConsumerConfig:
        return ConsumerConfig(
            durable_name=self.durable,
            filter_subject=self.filter_subject,
            # A new consumer starts from the beginning of the stream: nothing relayed
            # before its first start is skipped.
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait_s,
            max_deliver=-1,
            max_ack_pending=max(4 * self.batch_size, 1000),
        )

    async def _subscription(self) -> JetStreamContext.PullSubscription:
        if self._sub is not None and self._nc is not None and self._nc.is_connected:
            return self._sub
        await self.close()
        nc = await self.connect()
        try:
            js = nc.jetstream(timeout=5.0)
            await declare(js, self.stream)
            self._sub = await js.pull_subscribe(
                self.filter_subject,
                durable=self.durable,
                stream=EVENTS_STREAM,
                config=self.config(),
            )
        except BaseException:
            await close_quietly(nc)
            raise
        self._nc = nc
        return self._sub

    async def close(self) -> None:
        nc, self._nc, self._sub = self._nc, None, None
        if nc is not None:
            await close_quietly(nc)

    async def consume_once(self) -> int:
        """Fetch one batch, handle it, ack it; how many messages were handled."""
        sub = await self._subscription()
        try:
            messages = await sub.fetch(self.batch_size, timeout=self.fetch_timeout_s)
        except (NatsTimeoutError, TimeoutError):
            return 0
        events: list[CloudEvent] = []
        kept: list[Msg] = []
        for message in messages:
            try:
                events.append(CloudEvent.model_validate_json(message.data))
                kept.append(message)
            except ValidationError:
                logger.error(
                    "%s: dropping a message that is not a ModelForge CloudEvent (stream seq %d)",
                    self.durable,
                    message.metadata.sequence.stream,
                )
                await message.term()
        await self._handle(events, kept)
        return len(messages)

    async def _handle(self, events: list[CloudEvent], messages: list[Msg]) -> None:
        if not events:
            return
        try:
            await self.handle(events)
        except Exception as exc:
            if database_down(exc) or len(events) == 1:
                await self._refused(events, messages, exc)
                return
            # One event of the batch is at fault: find it, keep the rest.
            for event, message in zip(events, messages, strict=True):
                await self._handle([event], [message])
            return
        for message in messages:
            await message.ack()
        if self.metrics is not None:
            self.metrics.observe(self.durable, events)

    async def _refused(self, events: list[CloudEvent], messages: list[Msg], exc: Exception) -> None:
        if database_down(exc):
            for message in messages:
                await message.nak(delay=1.0)
            raise exc
        # It stays on the stream (max age) for a replay once the cause is fixed.
        event = events[0]
        logger.error(
            "%s: event %s (%s) cannot be handled; terminated",
            self.durable,
            event.id,
            event.action,
            exc_info=exc,
        )
        self.terminated += 1
        if self.metrics is not None:
            self.metrics.terminated.labels(self.durable).inc()
        await messages[0].term()

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until stop is set; failures are retried with capped backoff."""
        failures = 0
        try:
            while not stop.is_set():
                try:
                    await self.consume_once()
                except (*BROKER_ERRORS, SQLAlchemyError) as exc:
                    failures += 1
                    log = logger.warning if failures == 1 else logger.debug
                    log(
                        "%s: consuming failed (%s), %d in a row; retrying",
                        self.durable,
                        type(exc).__name__,
                        failures,
                    )
                    if not database_down(exc):
                        await self.close()
                    delay = min(0.1 * 2 ** min(failures, 10), self.max_backoff_s)
                    await wait_or_stop(stop, delay * random.uniform(0.5, 1.0))
                    continue
                if failures:
                    logger.info("%s: consuming again after %d failures", self.durable, failures)
                    failures = 0
        finally:
            await self.close()
