"""Runs the outbox relay inside every worker process, on the actors' event loop.

Any number of relays may run (they take turns through an advisory lock), so each worker
carries one and scaling workers never leaves events unpublished.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from functools import partial

import dramatiq
from dramatiq.asyncio import get_event_loop_thread
from dramatiq.middleware import Middleware

from broker.jetstream import AsyncResource
from store.notify import OUTBOX_CHANNEL, listening
from workers.database import Database
from workers.relay import OutboxRelay, connect_nats

logger = logging.getLogger("modelforge.workers.relay")


class OutboxRelayMiddleware(Middleware):
    """Must come after AsyncResourceMiddleware (it uses the shared database)."""

    def __init__(
        self,
        database: AsyncResource[Database],
        nats_url: str,
        *,
        batch_size: int,
        poll_interval_s: float,
    ) -> None:
        self._database = database
        self._nats_url = nats_url
        self._batch_size = batch_size
        self._poll_interval_s = poll_interval_s
        self._stop: asyncio.Event | None = None
        self._running: concurrent.futures.Future[None] | None = None

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        thread = get_event_loop_thread()
        if thread is None:
            raise RuntimeError("OutboxRelayMiddleware needs the AsyncIO middleware")
        # Not bound to a loop until first awaited (3.10+), so safe to make here.
        self._stop = asyncio.Event()
        self._running = asyncio.run_coroutine_threadsafe(self._run(self._stop), thread.loop)

    async def _run(self, stop: asyncio.Event) -> None:
        database = self._database.get()
        relay = OutboxRelay(
            database.sessions, partial(connect_nats, self._nats_url), batch_size=self._batch_size
        )
        url = database.engine.url.render_as_string(hide_password=False)
        try:
            async with listening(url, OUTBOX_CHANNEL) as wake:
                await relay.run(stop, self._poll_interval_s, wake)
        finally:
            await relay.close()

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        thread = get_event_loop_thread()
        if thread is None or self._running is None:
            return
        if self._stop is not None:
            thread.loop.call_soon_threadsafe(self._stop.set)
        try:
            self._running.result(timeout=15)
        except Exception:
            logger.exception("the outbox relay did not stop cleanly")
