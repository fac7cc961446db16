"""Dead letters of the worker broker: list, inspect, replay, delete."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from nats.errors import Error as NatsError
from nats.js.errors import Error as JetStreamError

from api.broker_link import BrokerLink
from api.errors import Conflict, NotFound, ServiceUnavailable
from broker.jetstream import dead_letters
from broker.jetstream.names import Names
from schemas.admin import DeadLetterInfo, DeadLetterList, DeadLetterReplayed


def _info(item: dead_letters.DeadLetter) -> DeadLetterInfo:
    message = item.message()
    return DeadLetterInfo(
        seq=item.seq,
        queue=item.queue_name,
        actor_name=message.actor_name if message else None,
        message_id=item.message_id,
        reason=item.reason,
        exception_type=item.exception_type,
        error=item.error,
        retries=item.retries,
        deliveries=item.deliveries,
        failed_at=datetime.fromtimestamp(item.failed_at_ms / 1000, UTC),
    )


@contextmanager
def _jetstream_errors() -> Iterator[None]:
    """Dead-letter lookups and mutations: "not found" is 404, NATS trouble is 503."""
    try:
        yield
    except dead_letters.DeadLetterNotFound as exc:
        raise NotFound(f"dead letter {exc.args[0]} does not exist") from None
    except (NatsError, JetStreamError, TimeoutError) as exc:
        raise ServiceUnavailable(f"JetStream did not answer ({type(exc).__name__})") from None


async def list_dead_letters(
    link: BrokerLink, names: Names, *, queue: str | None, after_seq: int, limit: int
) -> DeadLetterList:
    js = await link.jetstream()
    with _jetstream_errors():
        page = await dead_letters.list_dead_letters(
            js, names, start_seq=after_seq + 1, limit=limit, queue_name=queue
        )
    next_seq = page.next_seq - 1 if page.next_seq is not None else None
    return DeadLetterList(items=[_info(item) for item in page.items], next_seq=next_seq)


async def get_dead_letter(link: BrokerLink, names: Names, seq: int) -> DeadLetterInfo:
    js = await link.jetstream()
    with _jetstream_errors():
        return _info(await dead_letters.get_dead_letter(js, names, seq))


async def replay(link: BrokerLink, names: Names, seq: int) -> DeadLetterReplayed:
    js = await link.jetstream()
    with _jetstream_errors():
        try:
            message = await dead_letters.replay(js, names, seq, timeout_s=link.timeout_s)
        except ValueError as exc:  # not a dramatiq message: nothing to replay
            raise Conflict(str(exc)) from None
    return DeadLetterReplayed(seq=seq, queue=message.queue_name, message_id=message.message_id)


async def delete(link: BrokerLink, names: Names, seq: int) -> None:
    js = await link.jetstream()
    with _jetstream_errors():
        deleted = await dead_letters.delete(js, names, seq)
    if not deleted:
        raise NotFound(f"dead letter {seq} does not exist")
