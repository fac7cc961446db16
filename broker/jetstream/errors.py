"""dramatiq's broker errors, built with types (their constructors are unannotated)."""

from __future__ import annotations

from dramatiq.errors import (
    BrokerConnectionError,
    ConnectionClosed,
    ConnectionFailed,
    QueueJoinTimeout,
    QueueNotFound,
)
from nats.errors import Error as NatsError
from nats.js.errors import APIError

from broker.jetstream.loop import WaitExpired

# JetStream's "no suitable peers for placement": too few servers up for the replicas
# asked, as while a cluster has lost members. A 400, yet it passes once they are back.
_NO_SUITABLE_PEERS = 10005


def describe(cause: BaseException) -> str:
    """The cause as one line that says what failed, and for a timeout which bound fired.

    The type is qualified: nats-py's errors reuse built-in names (nats.errors.TimeoutError)
    and have an empty repr, so `TimeoutError()` alone says neither who timed out nor how.
    """
    kind = type(cause)
    name = kind.__qualname__
    if kind.__module__ != "builtins":
        name = f"{kind.__module__}.{name}"
    text = str(cause)
    line = f"{name}: {text}" if text else name
    if isinstance(cause, TimeoutError) and not isinstance(cause, WaitExpired):
        # WaitExpired says its own bound; anything else timed out inside the operation
        # (nats-py's request timeout, a connect bound), before the broker's wait did.
        line += " (the operation's own timeout)"
    return line


def connection_closed(cause: BaseException) -> ConnectionClosed:
    """Raised for a NATS call that failed or did not answer in time. dramatiq treats it
    as transient: a ConsumerThread restarts, a worker retries its ack every few seconds."""
    return ConnectionClosed(describe(cause))  # type: ignore[no-untyped-call]


def connection_failed(cause: BaseException) -> ConnectionFailed:
    return ConnectionFailed(f"cannot reach NATS JetStream: {describe(cause)}")  # type: ignore[no-untyped-call]


def queue_not_found(queue_name: str) -> QueueNotFound:
    return QueueNotFound(queue_name)  # type: ignore[no-untyped-call]


def queue_join_timeout(queue_name: str) -> QueueJoinTimeout:
    return QueueJoinTimeout(queue_name)  # type: ignore[no-untyped-call]


def unavailable(exc: BaseException) -> bool:
    """Whether a broker failure means JetStream cannot answer yet (no server reached, no
    leader elected, no quorum, too few servers up) rather than that it refused the
    request. The first passes on its own and is worth waiting out; the second is a
    configuration to fix, and waiting would only hide it."""
    cause = exc.__cause__ if isinstance(exc, BrokerConnectionError) else exc
    if cause is None:
        return False
    if isinstance(cause, APIError):
        return (cause.code or 0) >= 500 or cause.err_code == _NO_SUITABLE_PEERS
    # Timeouts (ours and nats-py's), no responders, connection lost or refused.
    return isinstance(cause, (TimeoutError, OSError, NatsError))
