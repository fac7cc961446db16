"""dramatiq's broker errors, built with types (their constructors are unannotated)."""

from __future__ import annotations

from dramatiq.errors import ConnectionClosed, ConnectionFailed, QueueJoinTimeout, QueueNotFound


def connection_closed(cause: BaseException) -> ConnectionClosed:
    """Raised for a NATS call that failed or did not answer in time. dramatiq treats it
    as transient: a ConsumerThread restarts, a worker retries its ack every few seconds."""
    return ConnectionClosed(repr(cause))  # type: ignore[no-untyped-call]


def connection_failed(cause: BaseException) -> ConnectionFailed:
    return ConnectionFailed(f"cannot reach NATS JetStream: {cause!r}")  # type: ignore[no-untyped-call]


def queue_not_found(queue_name: str) -> QueueNotFound:
    return QueueNotFound(queue_name)  # type: ignore[no-untyped-call]


def queue_join_timeout(queue_name: str) -> QueueJoinTimeout:
    return QueueJoinTimeout(queue_name)  # type: ignore[no-untyped-call]
