"""`modelforge events tail`: print node events as they arrive (or from the start).

An ordered ephemeral consumer: nothing is left behind on the server when it exits, and
it never acks, so it cannot disturb the durable consumers of workers or other teams.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import nats
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import DeliverPolicy

from broker.jetstream.settings import nats_servers
from broker.streams import EVENTS_STREAM


@dataclass(frozen=True)
class TailOptions:
    subject: str
    from_start: bool = False
    # Stop after this many events (None: never).
    limit: int | None = None
    # Stop when nothing arrived for this long (None: wait forever).
    idle_exit_s: float | None = None


async def tail(nats_url: str, options: TailOptions, emit: Callable[[dict[str, Any]], None]) -> int:
    """Stream matching events to emit() until a stop condition; returns how many."""

    async def quiet(exc: Exception) -> None:
        # nats-py prints a traceback per failed attempt by default; the caller reports once.
        pass

    # Bounded: with reconnects on, nats-py retries an unreachable first server forever.
    nc = await asyncio.wait_for(
        nats.connect(
            servers=nats_servers(nats_url),
            connect_timeout=5,
            max_reconnect_attempts=-1,
            error_cb=quiet,
        ),
        timeout=10,
    )
    try:
        js = nc.jetstream()
        subscription = await js.subscribe(
            options.subject,
            stream=EVENTS_STREAM,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL if options.from_start else DeliverPolicy.NEW,
        )
        seen = 0
        while options.limit is None or seen < options.limit:
            try:
                message = await subscription.next_msg(timeout=options.idle_exit_s or 3600.0)
            except (TimeoutError, NatsTimeoutError):
                if options.idle_exit_s is not None:
                    break
                continue
            emit(json.loads(message.data))
            seen += 1
        return seen
    finally:
        await nc.close()
