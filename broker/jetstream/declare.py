"""Idempotent stream and consumer declarations (create, or bring to this configuration).

Only features nats-server 2.9 has are used: one filter subject per consumer, nak
with delay, Nats-Msg-Id dedupe, purge by subject, MSG.GET with next_by_subj.
"""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    ReplayPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamInfo,
)
from nats.js.errors import BadRequestError

from broker.jetstream.names import Names
from broker.jetstream.settings import BrokerSettings


def tasks_stream_config(names: Names, settings: BrokerSettings) -> StreamConfig:
    # Work-queue retention: a message leaves the stream when acked, and the server
    # refuses a second consumer on the same subject, so a queue has exactly one
    # durable consumer which all worker processes share.
    return StreamConfig(
        name=names.tasks_stream,
        subjects=[names.tasks_subjects],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        duplicate_window=settings.dedupe_window_s,
        num_replicas=settings.replicas,
        placement=settings.placement(),
    )


def dead_letter_stream_config(names: Names, settings: BrokerSettings) -> StreamConfig:
    # Limits retention: dead letters stay until replayed, deleted, purged or aged out.
    return StreamConfig(
        name=names.dead_letter_stream,
        subjects=[names.dead_letter_subjects],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=settings.dead_letter_max_age_s,
        duplicate_window=settings.dedupe_window_s,
        num_replicas=settings.replicas,
        placement=settings.placement(),
    )


def queue_consumer_config(
    names: Names, settings: BrokerSettings, queue_name: str
) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=names.durable(queue_name),
        filter_subject=names.task_subject(queue_name),
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=settings.ack_wait_s,
        # Unlimited on the server: a message that hit a server-side max_deliver would
        # sit in the work queue undelivered and unreported. The consumer enforces
        # settings.max_deliveries itself and dead-letters instead (see intake.py).
        max_deliver=-1,
        max_ack_pending=settings.max_ack_pending,
        replay_policy=ReplayPolicy.INSTANT,
        # num_replicas unset (0): the consumer has its stream's replicas, so on an R3
        # stream it survives the loss of a server with it; a work-queue stream's
        # consumers must match the stream anyway.
    )


# JetStream's "stream name already in use" (with a different configuration).
_STREAM_NAME_IN_USE = 10058


async def declare_stream(js: JetStreamContext, config: StreamConfig) -> StreamInfo:
    """Create the stream, or bring an existing one to this configuration.

    Create-first, so processes starting together cannot race between a lookup and a
    create: JetStream accepts an identical create, and refuses a different one with
    10058, which is answered with an update. A change JetStream cannot apply in place
    (storage type, for one) raises.
    """
    if config.name is None:
        raise ValueError("stream config without a name")
    try:
        return await js.add_stream(config)
    except BadRequestError as exc:
        if exc.err_code != _STREAM_NAME_IN_USE:
            raise
    return await js.update_stream(config)


async def declare_consumer(js: JetStreamContext, stream: str, config: ConsumerConfig) -> None:
    # The legacy DURABLE.CREATE call creates the consumer, returns it unchanged when the
    # configuration is equal, and applies editable fields (ack_wait, max_ack_pending...)
    # when they differ, on 2.9 as on 2.10+.
    await js.add_consumer(stream, config)


async def declare_streams(js: JetStreamContext, names: Names, settings: BrokerSettings) -> None:
    await declare_stream(js, tasks_stream_config(names, settings))
    await declare_stream(js, dead_letter_stream_config(names, settings))
