"""Services that live on the actors' event loop for as long as the worker does, and the
one scaffold that runs each (LoopService).

The event pipeline (workers/pipeline.py) runs inside every worker process, on the
actors' event loop, so scaling workers scales the relay and the consumers with them.
The fleet gauges (workers/fleet_metrics.py) are refreshed the same way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import signal
from typing import ClassVar

import dramatiq
from dramatiq.asyncio import get_event_loop_thread
from dramatiq.middleware import Middleware

from broker.jetstream import AsyncResource
from workers.database import Database
from workers.metrics import PipelineMetrics
from workers.pipeline import Pipeline, PipelineSettings

logger = logging.getLogger("modelforge.workers.pipeline")


class LoopService(Middleware):
    """Runs `serve(stop)` on the AsyncIO middleware's loop from worker boot until
    shutdown, which sets `stop` and waits up to `stop_timeout_s` for it to return.

    A subclass names itself (`description`, for the log line of a stop that did not go
    cleanly), picks its logger and implements `serve`."""

    description: ClassVar[str]
    stop_timeout_s: ClassVar[float]
    log: ClassVar[logging.Logger]

    def __init__(self) -> None:
        self._stop: asyncio.Event | None = None
        self._running: concurrent.futures.Future[None] | None = None

    async def serve(self, stop: asyncio.Event) -> None:
        raise NotImplementedError

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        thread = get_event_loop_thread()
        if thread is None:
            raise RuntimeError(f"{type(self).__name__} needs the AsyncIO middleware")
        # Not bound to a loop until first awaited (3.10+), so safe to make here.
        self._stop = asyncio.Event()
        self._running = asyncio.run_coroutine_threadsafe(self.serve(self._stop), thread.loop)

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        thread = get_event_loop_thread()
        if thread is None or self._running is None:
            return
        if self._stop is not None:
            thread.loop.call_soon_threadsafe(self._stop.set)
        try:
            self._running.result(timeout=self.stop_timeout_s)
        except Exception:
            self.log.exception("%s did not stop cleanly", self.description)


class PipelineMiddleware(LoopService):
    """Must come after AsyncResourceMiddleware (it uses the shared database)."""

    description = "the event pipeline"
    stop_timeout_s = 15.0
    log = logger

    def __init__(
        self,
        database: AsyncResource[Database],
        settings: PipelineSettings,
        metrics: PipelineMetrics | None = None,
    ) -> None:
        super().__init__()
        self._database = database
        self._settings = settings
        self._metrics = metrics

    async def serve(self, stop: asyncio.Event) -> None:
        database = self._database.get()
        url = database.engine.url.render_as_string(hide_password=False)
        try:
            await Pipeline(database.sessions, url, self._settings, self._metrics).run(stop)
        except Exception:
            # A bug, not an outage (those are retried inside). A worker without its
            # pipeline would look healthy and do nothing: stop, so it is restarted.
            logger.exception("the event pipeline failed; stopping this worker")
            os.kill(os.getpid(), signal.SIGTERM)
