"""build_broker(): the one place that decides the middleware stack and its order.

Order matters: dramatiq calls before_* hooks in list order and after_* hooks in reverse,
so a middleware early in the list sees after_process_message *last* (after Retries has
decided whether the message failed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dramatiq.middleware import (
    AgeLimit,
    AsyncIO,
    Callbacks,
    CurrentMessage,
    Middleware,
    Pipelines,
    Retries,
    ShutdownNotifications,
    TimeLimit,
)
from prometheus_client import CollectorRegistry

from broker.jetstream.broker import JetStreamBroker
from broker.jetstream.metrics import JetStreamMetrics
from broker.jetstream.middleware import AsyncResource, AsyncResourceMiddleware
from broker.jetstream.settings import BrokerSettings


def build_middleware(
    settings: BrokerSettings,
    *,
    registry: CollectorRegistry | None = None,
    resources: Sequence[AsyncResource[Any]] = (),
) -> list[Middleware]:
    stack: list[Middleware] = []
    if registry is not None:
        # First, so its after_process_message runs last and sees the final outcome.
        stack.append(JetStreamMetrics(registry, lag_refresh_s=settings.lag_refresh_s))
    stack += [
        # Opt-in per actor (max_age=...): a message older than that is dead-lettered
        # instead of run; useful for "only matters if prompt" work. No default limit.
        AgeLimit(),
        # Bounds every actor run. Needed here more than elsewhere: the +WPI heartbeat
        # keeps an in-flight message alive for as long as its actor runs, so a hung
        # actor would otherwise hold its message (and a worker thread) forever.
        TimeLimit(time_limit=settings.time_limit_ms),
        # Opt-in per actor (notify_shutdown=True): interrupt instead of waiting for it
        # at SIGTERM; the interrupted run then counts as a failure and is retried.
        # By default in-flight actors finish and are acked during the drain.
        ShutdownNotifications(),
        # on_success/on_failure actor options; cheap, no backend.
        Callbacks(),
        # message pipelines (a | b); the next step is enqueued with its own message id,
        # so a crash between enqueue and ack is absorbed by Nats-Msg-Id dedupe.
        Pipelines(),
        # THE retry mechanism: a failed run is re-published as a new stream message
        # with a delay (native ETA) and its retry count; the failed delivery is acked.
        # Chosen over JetStream nak(delay=backoff) because it keeps failures (counted
        # in the message: options["retries"], per-actor max_retries/throws/retry_when)
        # apart from crash redeliveries (counted by the server: num_delivered, bounded
        # by settings.max_deliveries). The consumer never naks a failure, and the
        # server's max_deliver is unlimited, so JetStream never retries a failure.
        Retries(
            max_retries=settings.max_retries,
            min_backoff=settings.min_backoff_ms,
            max_backoff=settings.max_backoff_ms,
        ),
        # The event loop thread async def actors run on.
        AsyncIO(),
    ]
    if resources:
        # After AsyncIO: opened on its loop once it runs, closed before it stops.
        stack.append(AsyncResourceMiddleware(resources))
    # Lets an actor read its own message (message_id as an idempotency key).
    stack.append(CurrentMessage())
    # Not included: Results (JetStream is no result store; actors write to PostgreSQL),
    # GroupCallbacks (needs a rate-limiter backend), dramatiq's Prometheus (global
    # registry and its own HTTP server; JetStreamMetrics replaces it).
    return stack


def build_broker(
    settings: BrokerSettings,
    *,
    registry: CollectorRegistry | None = None,
    resources: Sequence[AsyncResource[Any]] = (),
    client_name: str = "modelforge-worker",
) -> JetStreamBroker:
    """Connect and return a broker. registry: where worker metrics go (None: no metrics).
    resources: async resources opened on the actors' event loop at worker boot."""
    return JetStreamBroker(
        settings,
        middleware=build_middleware(settings, registry=registry, resources=resources),
        client_name=client_name,
    )
