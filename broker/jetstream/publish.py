"""Publishing dramatiq messages to the tasks stream, from the broker or any async caller.

The API (async, own NATS connection) can call publish_message() directly; the broker's
synchronous enqueue() runs the same coroutine on its loop thread.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from dramatiq.message import Message
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import ServiceUnavailableError

from broker.jetstream import names as hdr
from broker.jetstream.names import Names

# Failures another attempt can cure: no answer yet (reconnecting), or JetStream
# momentarily without a leader. Anything else (payload too large...) is raised at once.
_TRANSIENT = (NatsTimeoutError, asyncio.TimeoutError, NoRespondersError, ServiceUnavailableError)

# Options this broker keeps in the message itself.
OPT_ETA = "eta"  # dramatiq's own name: ms since the epoch
OPT_RETRIES = "retries"  # dramatiq Retries' counter
OPT_REPLAYS = "replays"  # how many times the message came back from the dead-letter stream


def now_ms() -> int:
    return int(time.time() * 1000)


def dedupe_id(message: Message[Any]) -> str:
    """Nats-Msg-Id for this generation of the message.

    The first publish uses the dramatiq message_id as is. A retry (dramatiq Retries
    re-enqueues the *same* message_id) or a dead-letter replay must not be swallowed by
    the dedupe window, so they get a suffix; but it is deterministic, so a retry that
    is published twice (the worker died between publishing it and acking the failed
    original, which then fails again) is still deduplicated.
    """
    retries = int(message.options.get(OPT_RETRIES) or 0)
    replays = int(message.options.get(OPT_REPLAYS) or 0)
    suffix = ""
    if replays:
        suffix += f".replay-{replays}"
    if retries:
        suffix += f".retry-{retries}"
    return message.message_id + suffix


def with_eta(message: Message[Any], delay_ms: int | None) -> Message[Any]:
    """A copy carrying options["eta"] when delayed; the message unchanged otherwise."""
    if delay_ms is None:
        return message
    return message.copy(options={OPT_ETA: now_ms() + max(0, int(delay_ms))})


def headers_for(message: Message[Any]) -> dict[str, str]:
    headers = {hdr.MSG_ID: dedupe_id(message)}
    eta = message.options.get(OPT_ETA)
    if isinstance(eta, int | float):
        headers[hdr.ETA] = str(int(eta))
    return headers


async def publish_message(
    js: JetStreamContext,
    names: Names,
    message: Message[Any],
    *,
    timeout_s: float,
    attempts: int = 3,
) -> PubAck:
    """Publish and wait for the stream's ack, retrying transient failures.

    Retrying is safe because every attempt carries the same Nats-Msg-Id: if an earlier
    attempt did reach the stream, the server answers "duplicate" instead of storing it
    twice. The caller must have applied with_eta() already.
    """
    payload = message.encode()
    headers = headers_for(message)
    subject = names.task_subject(message.queue_name)
    last_error: Exception | None = None
    for attempt in range(attempts):
        try:
            return await js.publish(subject, payload, timeout=timeout_s, headers=headers)
        except _TRANSIENT as exc:
            last_error = exc
            await asyncio.sleep(min(0.1 * 2**attempt, 1.0))
    raise last_error if last_error is not None else ValueError("attempts must be positive")
