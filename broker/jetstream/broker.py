"""JetStreamBroker: dramatiq on NATS JetStream. Design notes in broker/jetstream/README.md."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.message import Message
from dramatiq.middleware import Middleware
from nats.errors import Error as NatsError
from nats.js.api import ConsumerInfo

from broker.jetstream.connection import connect
from broker.jetstream.consumer import JetStreamConsumer
from broker.jetstream.dead_letters import Reason
from broker.jetstream.declare import declare_consumer, declare_streams, queue_consumer_config
from broker.jetstream.errors import (
    connection_closed,
    connection_failed,
    queue_join_timeout,
    queue_not_found,
)
from broker.jetstream.inflight import Heartbeat, InFlight
from broker.jetstream.loop import LoopThread, WaitExpired
from broker.jetstream.names import Names
from broker.jetstream.publish import publish_message, with_eta
from broker.jetstream.puller import Puller
from broker.jetstream.runtime import Runtime
from broker.jetstream.settings import BrokerSettings

T = TypeVar("T")

logger = logging.getLogger(__name__)

# How often join() polls consumer info.
_JOIN_POLL_S = 0.05


class JetStreamBroker(dramatiq.Broker):
    """A dramatiq broker whose queues are durable pull consumers on one work-queue stream.

    Construction connects (bounded by settings.connect_timeout_s) and declares both
    streams; declare_queue() declares the queue's consumer. Build it with
    broker.jetstream.factory.build_broker(), which also sets the middleware.
    """

    def __init__(
        self,
        settings: BrokerSettings,
        *,
        middleware: list[Middleware] | None = None,
        client_name: str = "modelforge-broker",
    ) -> None:
        super().__init__(middleware=middleware)
        self.settings = settings
        self.names = Names(settings.namespace)
        # queue name -> durable consumer name. Only canonical queues: delays are native
        # (nak with delay), so no ".DQ" queue is ever declared and dramatiq's Worker
        # never starts a delay-queue consumer that would hold messages in memory.
        self.queues: dict[str, str] = {}
        self._closed = False
        loop = LoopThread(name=f"jetstream-broker-{settings.namespace}")
        loop.start()
        try:
            nc = loop.run(connect(settings, client_name), settings.connect_timeout_s + 1.0)
            js = nc.jetstream(timeout=settings.api_timeout_s)
            loop.run(declare_streams(js, self.names, settings), settings.api_timeout_s * 4)
        except (TimeoutError, OSError, NatsError) as exc:
            loop.stop()
            raise connection_failed(exc) from exc
        inflight = InFlight()
        self._rt = Runtime(
            settings=settings,
            names=self.names,
            loop=loop,
            nc=nc,
            js=js,
            inflight=inflight,
            on_dead_letter=self._dead_lettered,
            knows_actor=lambda name: name in self.actors,
        )
        # +WPI three times per ack_wait: one lost or late heartbeat is survivable.
        self._heartbeat: Future[None] = loop.submit(
            Heartbeat(inflight, settings.ack_wait_s / 3).run()
        )

    # -- bridge -------------------------------------------------------------------

    @property
    def runtime(self) -> Runtime:
        return self._rt

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run a coroutine on the broker's loop (with its connection) from any other thread,
        e.g. broker.run(dead_letters.list_dead_letters(broker.runtime.js, broker.names))."""
        return self._rt.loop.run(coro, timeout_s or self._rt.call_timeout_s)

    def _call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        try:
            return self.run(coro, timeout_s)
        except (TimeoutError, NatsError) as exc:
            raise connection_closed(exc) from exc

    # -- dramatiq.Broker ------------------------------------------------------------

    def declare_queue(self, queue_name: str) -> None:
        if queue_name in self.queues:
            return
        self.emit_before("declare_queue", queue_name)
        self._declare_consumer(queue_name)
        self.queues[queue_name] = self.names.durable(queue_name)
        self.emit_after("declare_queue", queue_name)

    def _declare_consumer(self, queue_name: str) -> None:
        config = queue_consumer_config(self.names, self.settings, queue_name)
        self._call(declare_consumer(self._rt.js, self.names.tasks_stream, config))

    def get_declared_delay_queues(self) -> set[str]:
        return set()

    def consume(
        self, queue_name: str, prefetch: int = 1, timeout: int = 30000
    ) -> JetStreamConsumer:
        if queue_name not in self.queues:
            raise queue_not_found(queue_name)
        # Declared again on every (re)start of a ConsumerThread: if an operator deleted
        # the consumer, the restart recreates it instead of failing forever.
        self._declare_consumer(queue_name)
        # Each pull request waits up to the worker's idle timeout on the server.
        puller = Puller(
            self._rt.nc,
            self.names.tasks_stream,
            self.queues[queue_name],
            expires_s=min(max(timeout / 1000, 0.1), 5.0),
        )
        self._call(puller.start())
        return JetStreamConsumer(
            self._rt,
            queue_name,
            puller,
            prefetch=self.settings.prefetch or prefetch,
            timeout_ms=timeout,
        )

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
        """Publish with Nats-Msg-Id (dedupe) and, when delayed, an ETA (header and
        options["eta"]); the consumer naks early deliveries until the ETA."""
        outgoing = self._outgoing(message, delay)
        self.emit_before("enqueue", outgoing, delay)
        self._call(self._publish(outgoing), timeout_s=self._publish_timeout_s)
        self.emit_after("enqueue", outgoing, delay)
        return outgoing

    async def enqueue_async(
        self, message: Message[Any], *, delay: int | None = None
    ) -> Message[Any]:
        """enqueue() for async code (async actors): waits without blocking the caller's
        event loop; the publish itself still runs on the broker's loop and connection."""
        outgoing = self._outgoing(message, delay)
        self.emit_before("enqueue", outgoing, delay)
        published = asyncio.wrap_future(self._rt.loop.submit(self._publish(outgoing)))
        # Not wait_for: its expiry and the publish's own timeout are both TimeoutError.
        done, _ = await asyncio.wait({published}, timeout=self._publish_timeout_s)
        if not done:
            published.cancel()
            expired = WaitExpired(f"publish did not finish within {self._publish_timeout_s:.1f}s")
            raise connection_closed(expired)
        try:
            published.result()
        except (TimeoutError, NatsError) as exc:
            raise connection_closed(exc) from exc
        self.emit_after("enqueue", outgoing, delay)
        return outgoing

    @staticmethod
    def _outgoing(message: Message[Any], delay: int | None) -> Message[Any]:
        # Retries passes the MessageProxy being processed: publish a plain copy whose
        # options no longer alias the proxy's.
        plain = message._message if isinstance(message, MessageProxy) else message
        return with_eta(plain.copy(), delay)

    async def _publish(self, message: Message[Any]) -> None:
        await publish_message(
            self._rt.js, self.names, message, timeout_s=self.settings.api_timeout_s
        )

    @property
    def _publish_timeout_s(self) -> float:
        # publish_message tries up to three times, each bounded by api_timeout_s.
        return self.settings.api_timeout_s * 4

    def flush(self, queue_name: str) -> None:
        """Drop the queue's pending messages and its dead letters."""
        js = self._rt.js

        async def purge() -> None:
            await js.purge_stream(
                self.names.tasks_stream, subject=self.names.task_subject(queue_name)
            )
            await js.purge_stream(
                self.names.dead_letter_stream, subject=self.names.dead_letter_subject(queue_name)
            )

        self._call(purge())

    def flush_all(self) -> None:
        js = self._rt.js

        async def purge() -> None:
            await js.purge_stream(self.names.tasks_stream)
            await js.purge_stream(self.names.dead_letter_stream)

        self._call(purge())

    def join(self, queue_name: str, *, timeout: int | None = None) -> None:
        """Wait until the queue has nothing undelivered and nothing unacked (delayed
        messages included: they are unacked on the server until their ETA)."""
        if queue_name not in self.queues:
            raise queue_not_found(queue_name)
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        while True:
            info = self.consumer_info(queue_name)
            if info.num_pending == 0 and info.num_ack_pending == 0:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise queue_join_timeout(queue_name)
            time.sleep(_JOIN_POLL_S)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._heartbeat.cancel()
        nc = self._rt.nc

        async def shutdown() -> None:
            try:
                # Flushes buffered acks/naks before closing.
                await nc.drain()
            except Exception:
                await nc.close()

        try:
            self._rt.loop.run(shutdown(), self._rt.call_timeout_s)
        except (TimeoutError, RuntimeError):
            logger.warning("NATS connection did not drain in time")
        self._rt.loop.stop()

    # -- JetStream extras -------------------------------------------------------------

    def consumer_info(self, queue_name: str) -> ConsumerInfo:
        info: ConsumerInfo = self._call(
            self._rt.js.consumer_info(self.names.tasks_stream, self.names.durable(queue_name))
        )
        return info

    def in_flight(self, queue_name: str) -> int:
        """Messages of queue_name this process holds unsettled (a gauge; racy read)."""
        return self._rt.inflight.count(queue_name)

    def _dead_lettered(self, queue_name: str, reason: Reason) -> None:
        # An optional middleware hook (metrics): after_dead_letter(broker, queue, reason).
        # Called on the broker loop: it must not block.
        for middleware in self.middleware:
            hook = getattr(middleware, "after_dead_letter", None)
            if hook is None:
                continue
            try:
                hook(self, queue_name, reason)
            except Exception:
                logger.exception("after_dead_letter failed in %r", middleware)

    def __repr__(self) -> str:
        return f"<JetStreamBroker namespace={self.names.namespace!r} queues={sorted(self.queues)}>"
