"""What to do with a freshly fetched message before dramatiq sees it.

dramatiq's ConsumerThread keeps any message with options["eta"] in an in-memory delay
queue, unacked, until the ETA: past ack_wait the server would hand it to another worker
too. So a message is only handed over when it is due, and without the "eta" option:

- not decodable                    -> dead letter (UNDECODABLE), ack
- ETA in the future                -> nak(delay=remaining): the server's redelivery timer
                                      holds it; no client does
- delivered > max_deliveries times -> dead letter (MAX_DELIVERIES), ack: crash-loop guard
- actor unknown to this process    -> nak(delay): a newer worker (rolling deploy) may know it
- otherwise                        -> held (in-flight, heartbeated) and handed to dramatiq
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from dramatiq.errors import DecodeError
from dramatiq.message import Message
from nats.aio.msg import Msg

from broker.jetstream import names as hdr
from broker.jetstream.dead_letters import Reason, dead_letter
from broker.jetstream.message import Delivery, JetStreamMessage
from broker.jetstream.publish import OPT_ETA, OPT_RETRIES, now_ms
from broker.jetstream.runtime import Runtime

logger = logging.getLogger(__name__)

# Added to every ETA nak so the redelivery lands just after the ETA, not a hair before
# it (which would cost another delivery and another nak).
_NAK_MARGIN_MS = 20


def _eta_of(msg: Msg, message: Message[Any]) -> int | None:
    raw = (msg.headers or {}).get(hdr.ETA)
    if raw is not None:
        try:
            return int(raw)
        except ValueError:
            pass
    eta = message.options.get(OPT_ETA)
    return int(eta) if isinstance(eta, int | float) else None


class Intake:
    def __init__(self, runtime: Runtime, queue_name: str) -> None:
        self._rt = runtime
        self._queue = queue_name

    async def admit(self, msg: Msg) -> JetStreamMessage | None:
        """Settle msg here (None) or register it in-flight and return it for dramatiq."""
        meta = msg.metadata
        seq = meta.sequence.stream
        delivered = meta.num_delivered
        try:
            message = Message.decode(msg.data)
        except DecodeError as exc:
            await self._dead_letter(
                msg, Reason.UNDECODABLE, seq, delivered, error=str(exc), payload=msg.data
            )
            return None

        eta = _eta_of(msg, message)
        now = now_ms()
        if eta is not None and eta > now:
            await msg.nak(delay=(eta - now + _NAK_MARGIN_MS) / 1000)
            return None

        # Every delivery of a delayed message that arrived before its ETA was nak'd
        # above and never reached an actor. Normally there is exactly one (the first),
        # when the message was stored before its ETA; so the crash-loop guard counts
        # deliveries minus that one. (Clock skew between workers beyond the nak margin
        # can cost one more delivery, which the guard then counts.)
        stored_ms = int(meta.timestamp.timestamp() * 1000)
        handoffs = delivered - (1 if eta is not None and eta > stored_ms else 0)
        known = self._rt.knows_actor(message.actor_name)
        if handoffs > self._rt.settings.max_deliveries:
            await self._dead_letter(
                msg,
                Reason.MAX_DELIVERIES,
                seq,
                delivered,
                message=message,
                exception_type="" if known else "ActorNotFound",
                error=f"delivered {delivered} times without being settled",
            )
            return None
        if not known:
            logger.warning(
                "message %s for unknown actor %r handed back",
                message.message_id,
                message.actor_name,
            )
            await msg.nak(delay=self._rt.settings.unknown_actor_delay_s)
            return None

        if OPT_ETA in message.options:
            # Due now: without this dramatiq would park it in its in-memory delay queue.
            options = {k: v for k, v in message.options.items() if k != OPT_ETA}
            message = dataclasses.replace(message, options=options)
        self._rt.inflight.add(self._queue, msg)
        logger.debug(
            "admitted seq %d (delivery %d) %s %s", seq, delivered, message.message_id, msg.reply
        )
        return JetStreamMessage(
            message,
            Delivery(msg=msg, stream_seq=seq, num_delivered=delivered, handoffs=handoffs),
        )

    async def _dead_letter(
        self,
        msg: Msg,
        reason: Reason,
        seq: int,
        delivered: int,
        *,
        message: Message[Any] | None = None,
        payload: bytes = b"",
        exception_type: str = "",
        error: str = "",
    ) -> None:
        await dead_letter(
            self._rt.js,
            self._rt.names,
            queue_name=self._queue,
            payload=message.encode() if message is not None else payload,
            reason=reason,
            source_seq=seq,
            deliveries=delivered,
            message_id=message.message_id if message is not None else "",
            retries=int(message.options.get(OPT_RETRIES) or 0) if message is not None else 0,
            exception_type=exception_type,
            error=error,
            timeout_s=self._rt.settings.api_timeout_s,
        )
        await msg.ack_sync(timeout=self._rt.settings.api_timeout_s)
        logger.error("message seq %d of %r dead-lettered: %s %s", seq, self._queue, reason, error)
        self._rt.on_dead_letter(self._queue, reason)
