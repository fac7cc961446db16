"""Outbox relay: publishes committed events to JetStream, in order, then marks them sent.

At-least-once into JetStream, deduplicated there by ``Nats-Msg-Id`` = event id: a
relay that dies between publish and mark republishes the same id, and the stream
drops the copy. A transaction-scoped advisory lock lets any number of relays run
while only one publishes at a time, which keeps every node's events in order.

One retry mechanism: the loop in ``run``. The NATS client never reconnects or buffers
publishes on its own; any broker failure closes it, and the next round (after a
backoff) connects afresh and declares the stream again. An outage therefore delays
events and never loses or reorders them, and nothing is published twice from two
places.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import nats
from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import PubAck
from sqlalchemy import Row, func, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from broker.jetstream.settings import nats_servers
from broker.streams import StreamSpec, declare, events_stream
from store.models import OutboxEvent
from store.notify import OUTBOX_CHANNEL, listening
from workers.settings import RelaySettings

logger = logging.getLogger("modelforge.relay")

# Arbitrary constant shared by every relay: "the outbox publisher" lock.
_RELAY_LOCK_KEY = 0x6D66_6F62  # "mfob"

# What a round may fail with and be retried: broker (nats errors include JetStream
# API errors and nats' TimeoutError), network, and database failures. Anything else
# is a bug and ends the process.
BROKER_ERRORS = (NatsError, TimeoutError, OSError)
_RETRYABLE = (*BROKER_ERRORS, SQLAlchemyError)
_WARN_EVERY_S = 60.0

Connect = Callable[[], Awaitable[NatsClient]]


async def connect_nats(url: str, timeout_s: float = 2.0) -> NatsClient:
    """One connection attempt, bounded by timeout_s per server; the relay's loop does
    the retrying. url: one server or a comma-separated list of a cluster's servers.

    allow_reconnect=False: a dropped connection closes the client instead of buffering
    publishes for a later replay. nats-py still tries each server
    max_reconnect_attempts+1 times inside one connect (0 would mean forever), hence 1 and
    the outer bound, which leaves time to get past a server that does not answer.
    """
    servers = nats_servers(url)

    async def quiet(exc: Exception) -> None:
        logger.debug("nats: %s", exc)

    return await asyncio.wait_for(
        nats.connect(
            servers=servers,
            allow_reconnect=False,
            max_reconnect_attempts=1,
            reconnect_time_wait=0.1,
            connect_timeout=timeout_s,
            error_cb=quiet,
        ),
        timeout=timeout_s * len(servers),
    )


@dataclass
class OutboxRelay:
    sessions: async_sessionmaker[AsyncSession]
    # Opens a fresh NATS connection; the relay owns it and closes it on any failure.
    connect: Connect
    batch_size: int = 200
    publish_timeout_s: float = 5.0
    max_backoff_s: float = 2.0
    # Declared on every new connection (replicas and placement from the settings).
    stream: StreamSpec = field(default_factory=events_stream)
    _nc: NatsClient | None = field(default=None, init=False, repr=False)
    # One context per connection: its first publish_async subscribes the ack inbox.
    _js: JetStreamContext | None = field(default=None, init=False, repr=False)

    async def prepare(self) -> JetStreamContext:
        """Connect if not connected, and declare the stream on every new connection."""
        if self._nc is not None and self._nc.is_connected and self._js is not None:
            return self._js
        await self.close()
        nc = await self.connect()
        js = nc.jetstream(timeout=self.publish_timeout_s)
        try:
            await declare(js, self.stream)
        except BaseException:
            await close_quietly(nc)
            raise
        self._nc, self._js = nc, js
        return js

    async def close(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None:
            await close_quietly(nc)

    async def relay_once(self) -> int:
        """Publish one batch. Returns how many events were marked sent.

        A publish failure ends the batch: the events JetStream acknowledged are marked
        and committed, the rest stay unsent, the connection is dropped, and the error
        is raised for the caller to retry later.
        """
        js = await self.prepare()
        async with self.sessions() as session, session.begin():
            locked = (
                await session.execute(select(func.pg_try_advisory_xact_lock(_RELAY_LOCK_KEY)))
            ).scalar_one()
            if not locked:
                return 0
            rows = (
                await session.execute(
                    select(
                        OutboxEvent.position,
                        OutboxEvent.id,
                        OutboxEvent.subject,
                        OutboxEvent.envelope,
                    )
                    .where(OutboxEvent.sent_at.is_(None))
                    .order_by(OutboxEvent.position)
                    .limit(self.batch_size)
                )
            ).all()
            sent, duplicates, failure = await self._publish(js, rows)
            if sent:
                await session.execute(
                    update(OutboxEvent)
                    .where(OutboxEvent.position.in_(sent))
                    .values(sent_at=func.now())
                )
        logger.debug("published %d events", len(sent))
        if duplicates:
            logger.info("%d events were already on the stream (republished)", duplicates)
        if failure is not None:
            await self.close()
            raise failure
        return len(sent)

    async def _publish(
        self, js: JetStreamContext, rows: Sequence[Row[Any]]
    ) -> tuple[list[int], int, Exception | None]:
        """Publish a batch pipelined: every message goes out, then the acks are awaited
        together. (positions acknowledged in order, duplicates, the first failure)

        Only the prefix acknowledged without a gap is reported sent: the rest stays in
        the outbox and is published again, in order, by the next round (JetStream drops
        the copies it already has, by Nats-Msg-Id).
        """
        futures: list[asyncio.Future[PubAck]] = []
        failure: Exception | None = None
        try:
            for row in rows:
                futures.append(
                    await js.publish_async(
                        row.subject,
                        json.dumps(row.envelope, separators=(",", ":")).encode(),
                        headers={"Nats-Msg-Id": str(row.id)},
                    )
                )
        except BROKER_ERRORS as exc:
            failure = exc
        if futures:
            await asyncio.wait(futures, timeout=self.publish_timeout_s)
        sent: list[int] = []
        duplicates = 0
        for row, future in zip(rows, futures, strict=False):
            if not future.done():
                failure = failure or TimeoutError("no publish acknowledgement in time")
                break
            if future.exception() is not None:
                error = future.exception()
                failure = failure or (error if isinstance(error, Exception) else None)
                break
            sent.append(row.position)
            duplicates += bool(future.result().duplicate)
        for future in futures:
            future.cancel()  # no-op for the finished ones
        return sent, duplicates, failure

    async def run(
        self, stop: asyncio.Event, poll_interval_s: float, wake: asyncio.Event | None = None
    ) -> None:
        """Relay until stop is set; every failure is retried with capped backoff.

        wake (store/notify.py: set when an outbox insert commits) ends an idle wait at
        once; the poll stays as the fallback for a missed notification.
        """
        failures = 0
        warned_at = 0.0
        try:
            while not stop.is_set():
                try:
                    count = await self.relay_once()
                except _RETRYABLE as exc:
                    failures += 1
                    # A warning when an outage starts and then once a minute, so a relay
                    # stuck on one event stays visible without flooding the log.
                    now = time.monotonic()
                    log = logger.debug
                    if failures == 1 or now - warned_at >= _WARN_EVERY_S:
                        log, warned_at = logger.warning, now
                    log(
                        "relaying failed (%s: %s), %d in a row; retrying",
                        type(exc).__name__,
                        exc,
                        failures,
                    )
                    delay = min(poll_interval_s * 2 ** min(failures, 10), self.max_backoff_s)
                    await wait_or_stop(stop, delay * random.uniform(0.5, 1.0))
                    continue
                if failures:
                    logger.info("relaying again after %d failed attempts", failures)
                    failures = 0
                if count < self.batch_size:
                    await _idle(stop, wake, poll_interval_s)
        finally:
            await self.close()


async def _idle(stop: asyncio.Event, wake: asyncio.Event | None, seconds: float) -> None:
    if wake is None:
        await wait_or_stop(stop, seconds)
        return
    if not wake.is_set():
        stopping = asyncio.ensure_future(stop.wait())
        woken = asyncio.ensure_future(wake.wait())
        await asyncio.wait({stopping, woken}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        woken.cancel()
    # Cleared before the next round reads the outbox: a commit after this point wakes
    # the round after it.
    wake.clear()


async def wait_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


async def close_quietly(nc: NatsClient) -> None:
    """Close a connection whatever state the broker is in. (The relay awaited every
    batch's acks, the consumers acked what they handled: nothing to flush or drain.)"""
    with contextlib.suppress(*BROKER_ERRORS):
        await nc.close()


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


async def serve(settings: RelaySettings, stop: asyncio.Event) -> None:
    from store.engine import make_engine, make_sessionmaker

    engine = make_engine(settings.database_url, pool_size=2)
    relay = OutboxRelay(
        make_sessionmaker(engine),
        partial(connect_nats, settings.nats_url),
        batch_size=settings.relay_batch_size,
        stream=settings.events_stream(),
    )
    where = ", ".join(_without_credentials(url) for url in nats_servers(settings.nats_url))
    logger.info("outbox relay starting against %s", where)
    try:
        async with listening(settings.database_url, OUTBOX_CHANNEL) as wake:
            await relay.run(stop, settings.relay_poll_interval_s, wake)
    finally:
        await engine.dispose()
