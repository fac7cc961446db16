"""Connection failures, said in one line: what could not be reached and why."""

from __future__ import annotations


def unreachable(exc: BaseException) -> str | None:
    """One line for a failure to reach a server; None when exc is something else.

    Imports stay inside: the agent-only install has no nats client.
    """
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused ({exc.strerror or exc})"
    if isinstance(exc, TimeoutError):
        return "timed out connecting"
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"could not connect: {exc.strerror}"
    try:
        from nats.errors import Error as NatsError
        from nats.errors import NoServersError
    except ImportError:
        return None
    if isinstance(exc, NoServersError):
        return "no NATS server answered (is `modelforge up` running?)"
    if isinstance(exc, NatsError):
        return f"NATS: {type(exc).__name__}: {exc}"
    return None
