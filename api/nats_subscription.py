"""One core NATS subscription held for as long as its owner wants it: the loop shared by
the job notifications (api/notifications.py) and the operators' event stream
(api/event_fanout.py).

Each connection is made without nats-py's own reconnect, so that an outage is seen here:
the loop closes the dead connection, waits (0.5 s doubling to 10 s, reset by every
successful subscription) and connects again, until `stop` is set. The API therefore
starts and serves while NATS is down; the subscriber just hears nothing meanwhile.

`ready` is set while the server holds the subscription (after the flush that follows
the subscribe), and cleared the moment the connection is lost, the loop stops or its
task is cancelled. A failed attempt is logged at debug only; an owner that asks to be
`announced` gets one info line per subscription and one warning per outage, never one
per retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Final

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from broker.jetstream.settings import nats_servers

FIRST_DELAY_S: Final = 0.5
MAX_DELAY_S: Final = 10.0
# How often a held subscription checks its connection (and `stop`, which also wakes it).
CHECK_S: Final = 1.0


async def subscribe_forever(
    nats_url: str,
    subject: str,
    callback: Callable[[Msg], Awaitable[None]],
    *,
    ready: asyncio.Event,
    stop: asyncio.Event,
    client_name: str,
    label: str,
    logger: logging.Logger,
    announce: bool = False,
) -> None:
    """Hold a core subscription on `subject` until `stop`, reconnecting with backoff.
    `label` names the subscriber in its log lines, `client_name` its NATS connection."""

    async def quiet(error: Exception) -> None:
        # Instead of nats-py's traceback per failed attempt (e.g. a cluster member that
        # is down); the loop reports the outcome.
        logger.debug("%s: nats: %s", label, error)

    delay = FIRST_DELAY_S
    while not stop.is_set():
        nc: NatsClient | None = None
        try:
            nc = await asyncio.wait_for(
                nats.connect(
                    servers=nats_servers(nats_url),
                    allow_reconnect=False,
                    max_reconnect_attempts=1,
                    connect_timeout=2,
                    name=client_name,
                    error_cb=quiet,
                ),
                5,
            )
            await nc.subscribe(subject, cb=callback)
            # Registered on the server once the flush returns: whoever waits for `ready`
            # then sees every message published from that moment.
            await nc.flush(timeout=2)
            ready.set()
            delay = FIRST_DELAY_S
            if announce:
                logger.info("relaying %s from %s", label, subject)
            while not stop.is_set() and nc.is_connected:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), CHECK_S)
        except (OSError, TimeoutError, nats.errors.Error) as exc:
            logger.debug("%s: NATS unavailable (%s)", label, type(exc).__name__)
        finally:
            # Once per outage: only a subscription that was held is reported lost.
            if announce and ready.is_set() and not stop.is_set():
                logger.warning("%s paused: NATS connection lost", label)
            ready.clear()
            if nc is not None and not nc.is_closed:
                with contextlib.suppress(Exception):
                    await nc.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        delay = min(delay * 2, MAX_DELAY_S)
