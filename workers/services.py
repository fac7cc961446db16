"""Runs the event pipeline (workers/pipeline.py) inside every worker process, on the
actors' event loop, so scaling workers scales the relay and the consumers with them."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import signal

import dramatiq
from dramatiq.asyncio import get_event_loop_thread
from dramatiq.middleware import Middleware

from broker.jetstream import AsyncResource
from workers.database import Database
from workers.metrics import PipelineMetrics
from workers.pipeline import Pipeline, PipelineSettings

logger = logging.getLogger("modelforge.workers.pipeline")


class PipelineMiddleware(Middleware):
    """Must come after AsyncResourceMiddleware (it uses the shared database)."""

    def __init__(
        self,
        database: AsyncResource[Database],
        settings: PipelineSettings,
        metrics: PipelineMetrics | None = None,
    ) -> None:
        self._database = database
        self._settings = settings
        self._metrics = metrics
        self._stop: asyncio.Event | None = None
        self._running: concurrent.futures.Future[None] | None = None

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        thread = get_event_loop_thread()
        if thread is None:
            raise RuntimeError("PipelineMiddleware needs the AsyncIO middleware")
        # Not bound to a loop until first awaited (3.10+), so safe to make here.
        self._stop = asyncio.Event()
        self._running = asyncio.run_coroutine_threadsafe(self._run(self._stop), thread.loop)

    async def _run(self, stop: asyncio.Event) -> None:
        database = self._database.get()
        url = database.engine.url.render_as_string(hide_password=False)
        try:
            await Pipeline(database.sessions, url, self._settings, self._metrics).run(stop)
        except Exception:
            # A bug, not an outage (those are retried inside). A worker without its
            # pipeline would look healthy and do nothing: stop, so it is restarted.
            logger.exception("the event pipeline failed; stopping this worker")
            os.kill(os.getpid(), signal.SIGTERM)

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        thread = get_event_loop_thread()
        if thread is None or self._running is None:
            return
        if self._stop is not None:
            thread.loop.call_soon_threadsafe(self._stop.set)
        try:
            self._running.result(timeout=15)
        except Exception:
            logger.exception("the event pipeline did not stop cleanly")
