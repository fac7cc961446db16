"""The dead-letter stream: what the broker writes there and what an admin can do with it.

Each entry is one message that will not run again on its own: its body is the dramatiq
message as it was when it gave up (options["retries"], options["traceback"] included) or
the raw bytes when it could not be decoded; the why is in headers (names.DL_*).

These are plain coroutines over a JetStreamContext so the async admin API can call them
on its own connection; the broker calls dead_letter() on its loop.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dramatiq.errors import DecodeError
from dramatiq.message import Message
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from nats.js.errors import APIError, NotFoundError

from broker.jetstream import names as hdr
from broker.jetstream.names import Names
from broker.jetstream.publish import (
    OPT_ETA,
    OPT_REPLAYS,
    OPT_RETRIES,
    now_ms,
    publish_message,
)

# Options that belong to one life of a message and are dropped on replay.
_PER_LIFE_OPTIONS = (OPT_RETRIES, OPT_ETA, "traceback", "requeue_timestamp")
_HEADER_LIMIT = 512
# JetStream error codes for "no such message": 10037 (get), 10057 (delete, sent as 500).
_NO_MESSAGE = {10037, 10057}
# 2.9 answers a delete of a missing message with the generic "delete failed" code 10043
# and the description "sequence N not found"; other 10043s are real failures.
_DELETE_FAILED = 10043


class Reason(StrEnum):
    FAILED = "failed"  # the actor failed and dramatiq gave up (retries exhausted, throws, age)
    MAX_DELIVERIES = "max_deliveries"  # delivered too often without settling: crash loop
    UNDECODABLE = "undecodable"  # not a dramatiq message


class DeadLetterNotFound(LookupError):
    pass


@dataclass(frozen=True)
class DeadLetter:
    seq: int  # sequence in the dead-letter stream: the handle for replay/delete
    queue_name: str
    reason: str
    exception_type: str
    error: str
    deliveries: int  # server delivery count of the last delivery (ETA naks included)
    retries: int  # dramatiq's options["retries"]: failed runs so far
    source_seq: int  # sequence the message had in the tasks stream
    message_id: str
    failed_at_ms: int
    payload: bytes

    def message(self) -> Message[Any] | None:
        try:
            return Message.decode(self.payload)
        except DecodeError:
            return None


@dataclass(frozen=True)
class DeadLetterPage:
    items: list[DeadLetter]
    # Pass as start_seq for the next page; None when this page was the last.
    next_seq: int | None


def _one_line(value: str) -> str:
    return " ".join(value.split())[:_HEADER_LIMIT]


async def dead_letter(
    js: JetStreamContext,
    names: Names,
    *,
    queue_name: str,
    payload: bytes,
    reason: Reason,
    source_seq: int,
    deliveries: int,
    message_id: str = "",
    retries: int = 0,
    exception_type: str = "",
    error: str = "",
    timeout_s: float,
) -> int:
    """Store one dead letter; returns its sequence. Idempotent per source message: the
    caller acks the original only after this returns, and a repeat (crash in between)
    is deduplicated on the source sequence."""
    headers = {
        hdr.MSG_ID: f"{names.tasks_stream}-{source_seq}",
        hdr.DL_QUEUE: queue_name,
        hdr.DL_REASON: reason.value,
        hdr.DL_SOURCE_SEQ: str(source_seq),
        hdr.DL_DELIVERIES: str(deliveries),
        hdr.DL_RETRIES: str(retries),
        hdr.DL_FAILED_AT: str(now_ms()),
    }
    if message_id:
        headers[hdr.DL_MESSAGE_ID] = _one_line(message_id)
    if exception_type:
        headers[hdr.DL_EXCEPTION] = _one_line(exception_type)
    if error:
        headers[hdr.DL_ERROR] = _one_line(error)
    ack = await js.publish(
        names.dead_letter_subject(queue_name), payload, timeout=timeout_s, headers=headers
    )
    return ack.seq


def _parse(names: Names, raw: RawStreamMsg) -> DeadLetter:
    headers = raw.headers or {}

    def integer(key: str) -> int:
        try:
            return int(headers.get(key, "0"))
        except ValueError:
            return 0

    if raw.seq is None or raw.subject is None:
        raise ValueError("stream message without sequence or subject")
    return DeadLetter(
        seq=raw.seq,
        queue_name=headers.get(hdr.DL_QUEUE) or names.queue_of_dead_letter_subject(raw.subject),
        reason=headers.get(hdr.DL_REASON, ""),
        exception_type=headers.get(hdr.DL_EXCEPTION, ""),
        error=headers.get(hdr.DL_ERROR, ""),
        deliveries=integer(hdr.DL_DELIVERIES),
        retries=integer(hdr.DL_RETRIES),
        source_seq=integer(hdr.DL_SOURCE_SEQ),
        message_id=headers.get(hdr.DL_MESSAGE_ID, ""),
        failed_at_ms=integer(hdr.DL_FAILED_AT),
        payload=raw.data or b"",
    )


async def list_dead_letters(
    js: JetStreamContext,
    names: Names,
    *,
    start_seq: int = 1,
    limit: int = 50,
    queue_name: str | None = None,
) -> DeadLetterPage:
    """Up to limit dead letters with sequence >= start_seq, oldest first, optionally of
    one queue. Pages by stream sequence, so concurrent deletes never shift a page."""
    if limit < 1:
        raise ValueError("limit must be positive")
    subject = names.dead_letter_subject(queue_name) if queue_name else names.dead_letter_subjects
    items: list[DeadLetter] = []
    cursor = max(1, start_seq)
    while len(items) < limit:
        try:
            raw = await js.get_msg(names.dead_letter_stream, seq=cursor, subject=subject, next=True)
        except NotFoundError:
            return DeadLetterPage(items=items, next_seq=None)
        item = _parse(names, raw)
        items.append(item)
        cursor = item.seq + 1
    return DeadLetterPage(items=items, next_seq=cursor)


async def get_dead_letter(js: JetStreamContext, names: Names, seq: int) -> DeadLetter:
    try:
        raw = await js.get_msg(names.dead_letter_stream, seq=seq)
    except NotFoundError:
        raise DeadLetterNotFound(seq) from None
    return _parse(names, raw)


async def replay(js: JetStreamContext, names: Names, seq: int, *, timeout_s: float) -> Message[Any]:
    """Send dead letter seq back to its queue with a fresh retry budget, then delete it.

    Fresh means: no retries/traceback/eta, and message_timestamp = now so an AgeLimit
    does not drop it at once. options["replays"] counts replays; it also gives the
    publish its own Nats-Msg-Id (not swallowed by dedupe), the same one if this replay
    is repeated after a crash between publish and delete.
    """
    item = await get_dead_letter(js, names, seq)
    message = item.message()
    if message is None:
        raise ValueError(f"dead letter {seq} is not a dramatiq message; it cannot be replayed")
    options = {k: v for k, v in message.options.items() if k not in _PER_LIFE_OPTIONS}
    options[OPT_REPLAYS] = int(message.options.get(OPT_REPLAYS) or 0) + 1
    fresh = dataclasses.replace(
        message, queue_name=item.queue_name, options=options, message_timestamp=now_ms()
    )
    await publish_message(js, names, fresh, timeout_s=timeout_s)
    await delete(js, names, seq)
    return fresh


async def delete(js: JetStreamContext, names: Names, seq: int) -> bool:
    """Remove one dead letter; False if it was already gone."""
    try:
        return await js.delete_msg(names.dead_letter_stream, seq)
    except APIError as exc:
        if isinstance(exc, NotFoundError) or exc.err_code in _NO_MESSAGE:
            return False
        if exc.err_code == _DELETE_FAILED and "not found" in (exc.description or ""):
            return False
        raise


async def purge(js: JetStreamContext, names: Names, queue_name: str | None = None) -> bool:
    """Remove every dead letter, or those of one queue."""
    subject = names.dead_letter_subject(queue_name) if queue_name else None
    return await js.purge_stream(names.dead_letter_stream, subject=subject)
