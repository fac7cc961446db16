"""dramatiq's Consumer over one queue's shared durable pull consumer.

Called from dramatiq threads: __next__/requeue/close from the ConsumerThread, ack/nack
from WorkerThreads. Each call runs one coroutine on the broker loop, bounded in time.
Settling goes through the JetStreamMessage itself, so a message fetched by a consumer
that was since closed and replaced (ConsumerThread restart) is still acked correctly.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Coroutine, Iterable
from typing import Any

import dramatiq
from nats.errors import Error as NatsError
from nats.errors import MsgAlreadyAckdError

from broker.jetstream.dead_letters import Reason, dead_letter
from broker.jetstream.errors import connection_closed
from broker.jetstream.intake import Intake
from broker.jetstream.message import JetStreamMessage
from broker.jetstream.publish import OPT_RETRIES
from broker.jetstream.puller import ConsumerGone, Puller
from broker.jetstream.runtime import Runtime

logger = logging.getLogger(__name__)


def _exception_name(exc: BaseException) -> str:
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


class JetStreamConsumer(dramatiq.Consumer):
    def __init__(
        self,
        runtime: Runtime,
        queue_name: str,
        puller: Puller,
        *,
        prefetch: int,
        timeout_ms: int,
    ) -> None:
        self._rt = runtime
        self._queue = queue_name
        self._puller = puller
        self._prefetch = max(1, prefetch)
        self._timeout_s = max(0.05, timeout_ms / 1000)
        self._intake = Intake(runtime, queue_name)

    # -- fetching ---------------------------------------------------------------

    def __next__(self) -> JetStreamMessage | None:
        try:
            return self._rt.loop.run(
                self._next(), self._timeout_s + self._rt.settings.api_timeout_s
            )
        except TimeoutError:
            return None
        except (NatsError, ConsumerGone) as exc:
            raise connection_closed(exc) from exc

    async def _next(self) -> JetStreamMessage | None:
        """The next due message, or None after about timeout_s without one.

        One message per pull request: a lingering batch request would hold the first
        message back until the batch filled or the request expired. A request is only
        sent while this process holds fewer than prefetch messages of the queue (the
        server's max_ack_pending is shared by all workers), and at most one is open, so
        the bound holds even when a request is answered after we stopped waiting.
        """
        deadline = time.monotonic() + self._timeout_s
        puller, inflight = self._puller, self._rt.inflight
        while (remaining := deadline - time.monotonic()) > 0.01:
            if not puller.busy():
                if inflight.count(self._queue) >= self._prefetch:
                    if not await inflight.wait_below(self._queue, self._prefetch, remaining):
                        return None
                    continue
                await puller.request()
            msg = await puller.receive(remaining)
            if msg is None:
                continue
            try:
                admitted = await self._intake.admit(msg)
            except NatsError:
                # Not in-flight, so not heartbeated: the server redelivers it after
                # ack_wait. Naking it now could spin on a persistent failure.
                logger.warning("could not triage message on %r", self._queue, exc_info=True)
                continue
            if admitted is not None:
                return admitted
        return None

    # -- settling ---------------------------------------------------------------

    def ack(self, message: JetStreamMessage) -> None:  # type: ignore[override]
        """The actor finished (its transaction committed): remove it from the stream.

        ack_sync waits for the server to confirm; on failure dramatiq retries the ack
        every few seconds (BrokerConnectionError), the message stays in-flight and
        heartbeated meanwhile, so it is neither lost nor handed to another worker.
        """
        self._settle(self._ack(message))

    async def _ack(self, message: JetStreamMessage) -> None:
        msg = message.delivery.msg
        with contextlib.suppress(MsgAlreadyAckdError):
            await msg.ack_sync(timeout=self._rt.settings.api_timeout_s)
        logger.debug("acked seq %d %s", message.delivery.stream_seq, msg.reply)
        await self._rt.inflight.discard(self._queue, msg)

    def nack(self, message: JetStreamMessage) -> None:  # type: ignore[override]
        """dramatiq gave up on the message (retries exhausted, throws, age limit, unknown
        actor): store it as a dead letter, then ack the original."""
        self._settle(self._dead_letter(message))

    async def _dead_letter(self, message: JetStreamMessage) -> None:
        exc = message.exception()
        delivery = message.delivery
        await dead_letter(
            self._rt.js,
            self._rt.names,
            queue_name=self._queue,
            payload=message.encoded(),
            reason=Reason.FAILED,
            source_seq=delivery.stream_seq,
            deliveries=delivery.num_delivered,
            message_id=message.message_id,
            retries=int(message.options.get(OPT_RETRIES) or 0),
            exception_type=_exception_name(exc) if exc is not None else "",
            error=str(exc) if exc is not None else "",
            timeout_s=self._rt.settings.api_timeout_s,
        )
        await self._ack(message)
        self._rt.on_dead_letter(self._queue, Reason.FAILED)

    def requeue(self, messages: Iterable[JetStreamMessage]) -> None:  # type: ignore[override]
        """Worker shutdown: messages fetched but never started go back at once (nak
        without delay) so another worker takes them now rather than after ack_wait."""
        batch = list(messages)
        if batch:
            self._settle(self._requeue(batch))

    async def _requeue(self, messages: list[JetStreamMessage]) -> None:
        for message in messages:
            msg = message.delivery.msg
            with contextlib.suppress(MsgAlreadyAckdError):
                await msg.nak()
            logger.debug("requeued seq %d %s", message.delivery.stream_seq, msg.reply)
            await self._rt.inflight.discard(self._queue, msg)

    def _settle(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            self._rt.loop.run(coro, self._rt.call_timeout_s)
        except (TimeoutError, NatsError) as exc:
            raise connection_closed(exc) from exc

    def close(self) -> None:
        """Let the open pull request end, hand back what it delivered, unsubscribe."""
        try:
            self._rt.loop.run(self._close(), self._rt.call_timeout_s)
        except (TimeoutError, NatsError, RuntimeError) as exc:
            logger.warning("closing consumer of %r: %s", self._queue, exc)

    async def _close(self) -> None:
        for msg in await self._puller.close():
            with contextlib.suppress(MsgAlreadyAckdError):
                await msg.nak()
