"""Outbox relay: publishes committed events to JetStream, in order, then marks them sent.

At-least-once into JetStream, deduplicated there by ``Nats-Msg-Id`` = event id: a
relay that dies between publish and mark republishes the same id, and the stream
drops the copy. A transaction-scoped advisory lock lets any number of relays run
while only one publishes at a time, which keeps every node's events in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass

import nats
from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError
from nats.js.errors import Error as JetStreamError
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from broker.streams import declare, events_stream
from store.models import OutboxEvent
from workers.settings import RelaySettings

logger = logging.getLogger("modelforge.relay")

# Arbitrary constant shared by every relay: "the outbox publisher" lock.
_RELAY_LOCK_KEY = 0x6D66_6F62  # "mfob"


@dataclass
class OutboxRelay:
    sessions: async_sessionmaker[AsyncSession]
    nc: NatsClient
    batch_size: int = 200
    publish_timeout_s: float = 5.0

    async def prepare(self) -> None:
        await declare(self.nc.jetstream(), events_stream())

    async def relay_once(self) -> int:
        """Publish one batch. Returns how many events were marked sent."""
        js = self.nc.jetstream(timeout=self.publish_timeout_s)
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
            if not rows:
                return 0
            sent: list[int] = []
            try:
                for row in rows:
                    await js.publish(
                        row.subject,
                        json.dumps(row.envelope, separators=(",", ":")).encode(),
                        headers={"Nats-Msg-Id": str(row.id)},
                    )
                    sent.append(row.position)
            finally:
                # Whatever was acknowledged by JetStream is marked, even if a later
                # publish in the batch failed; the rest waits for the next round.
                if sent:
                    await session.execute(
                        update(OutboxEvent)
                        .where(OutboxEvent.position.in_(sent))
                        .values(sent_at=func.now())
                    )
            return len(sent)

    async def run(self, stop: asyncio.Event, poll_interval_s: float) -> None:
        backoff = poll_interval_s
        while not stop.is_set():
            try:
                count = await self.relay_once()
                backoff = poll_interval_s
            except (NatsError, JetStreamError, TimeoutError, OSError) as exc:
                logger.warning("publishing to JetStream failed (%s); retrying", type(exc).__name__)
                count = 0
                backoff = min(backoff * 2, 5.0)
            if count == 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=backoff)


async def connect_nats(url: str) -> NatsClient:
    # Reconnect forever: an outage delays events, it must not kill the relay.
    return await nats.connect(
        url,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        allow_reconnect=True,
        connect_timeout=2,
    )


async def serve(settings: RelaySettings, stop: asyncio.Event) -> None:
    from store.engine import make_engine, make_sessionmaker

    engine = make_engine(settings.database_url, pool_size=2)
    nc = await connect_nats(settings.nats_url)
    relay = OutboxRelay(make_sessionmaker(engine), nc, batch_size=settings.relay_batch_size)
    try:
        await relay.prepare()
        logger.info("outbox relay running against %s", settings.nats_url)
        await relay.run(stop, settings.relay_poll_interval_s)
    finally:
        await nc.drain()
        await engine.dispose()
