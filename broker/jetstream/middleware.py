"""Shared async resources for async actors (e.g. one async SQLAlchemy engine per process).

dramatiq runs every async actor on one event loop thread, started by its AsyncIO
middleware at worker boot. Loop-bound resources (asyncpg pools, httpx clients) must be
created on that loop and closed there, once, around the worker's life:

    engine = AsyncResource("db", lambda: make_engine(url), lambda e: e.dispose())
    broker = build_broker(settings, resources=[engine])      # after AsyncIO
    @dramatiq.actor(broker=broker)
    async def sweep() -> None:
        async with engine.get().begin() as conn: ...

The handle (not a module global) is what actors close over.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

import dramatiq
from dramatiq.asyncio import get_event_loop_thread
from dramatiq.middleware import Middleware, MiddlewareError

T = TypeVar("T")

logger = logging.getLogger(__name__)


class ResourceBootError(MiddlewareError):
    """A resource could not be created: the worker must not start without it.

    (dramatiq swallows other exceptions raised by middleware hooks, but re-raises
    MiddlewareError out of Worker.start().)
    """


class AsyncResource(Generic[T]):
    def __init__(
        self,
        name: str,
        factory: Callable[[], Awaitable[T]],
        disposer: Callable[[T], Awaitable[None]] | None = None,
    ) -> None:
        self.name = name
        self._factory = factory
        self._disposer = disposer
        self._value: T | None = None

    def get(self) -> T:
        """The resource; only between worker boot and shutdown, on the actors' loop."""
        if self._value is None:
            raise RuntimeError(f"async resource {self.name!r} is not open (worker not booted?)")
        return self._value

    async def _open(self) -> None:
        self._value = await self._factory()

    async def _close(self) -> None:
        value, self._value = self._value, None
        if value is not None and self._disposer is not None:
            await self._disposer(value)


class AsyncResourceMiddleware(Middleware):
    """Opens resources in order at worker boot and closes them in reverse at shutdown,
    on the AsyncIO middleware's loop. Must come after AsyncIO in the middleware list
    (before_* hooks run in list order, after_* in reverse: so the loop exists when we
    open, and still runs when we close after the last actor finished)."""

    def __init__(self, resources: Sequence[AsyncResource[Any]], *, timeout_s: float = 60.0) -> None:
        self.resources = list(resources)
        self.timeout_s = timeout_s
        self._opened: list[AsyncResource[Any]] = []

    def _loop(self) -> asyncio.AbstractEventLoop:
        thread = get_event_loop_thread()
        if thread is None:
            raise ResourceBootError(
                "AsyncResourceMiddleware needs the AsyncIO middleware before it"
            )
        return thread.loop

    def before_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        loop = self._loop()
        for resource in self.resources:
            try:
                asyncio.run_coroutine_threadsafe(resource._open(), loop).result(self.timeout_s)
            except Exception as exc:
                self._close_all(loop)
                raise ResourceBootError(f"opening {resource.name!r} failed: {exc!r}") from exc
            self._opened.append(resource)
            logger.info("async resource %r open", resource.name)

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        thread = get_event_loop_thread()
        if thread is not None:
            self._close_all(thread.loop)

    def _close_all(self, loop: asyncio.AbstractEventLoop) -> None:
        while self._opened:
            resource = self._opened.pop()
            try:
                asyncio.run_coroutine_threadsafe(resource._close(), loop).result(self.timeout_s)
                logger.info("async resource %r closed", resource.name)
            except Exception:
                logger.exception("closing async resource %r failed", resource.name)
