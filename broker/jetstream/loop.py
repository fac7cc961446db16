"""The broker's own asyncio loop, in one daemon thread.

nats-py is asyncio-only while dramatiq's consumers and workers are plain threads; every
broker operation is a coroutine submitted here and waited for with a bound.

Two bounds can end an operation with a TimeoutError: the wait here (WaitExpired), and
whatever the operation bounds itself (nats-py's request timeout, an asyncio.wait_for).
They are kept apart: on Python 3.11 concurrent.futures.TimeoutError is the built-in
TimeoutError, which nats.errors.TimeoutError subclasses too, so catching it around
future.result() would relabel the operation's own timeout as this wait's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

logger = logging.getLogger(__name__)


class WaitExpired(TimeoutError):
    """The bound of LoopThread.run passed before the operation finished (it is cancelled).
    A TimeoutError of another type was raised by the operation itself."""


class LoopThread:
    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def start(self, timeout_s: float = 5.0) -> None:
        self._thread.start()
        ready = threading.Event()
        self._loop.call_soon_threadsafe(ready.set)
        if not ready.wait(timeout_s):
            raise RuntimeError("broker event loop did not start")

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._loop.is_running()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run coro on the loop and wait at most timeout_s for it.

        Raises WaitExpired (and cancels coro) when the bound passes; what coro raises,
        a TimeoutError of its own included, is raised unchanged. Calling this from the
        loop thread itself would wait on itself forever, so that is refused.
        """
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("blocking broker call from the broker's own event loop")
        if not self.alive:
            coro.close()
            raise RuntimeError("the broker's event loop is not running (broker closed?)")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        done, _ = concurrent.futures.wait([future], timeout_s)
        if not done:
            future.cancel()
            raise WaitExpired(f"broker operation did not finish within {timeout_s:.1f}s")
        return future.result()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start coro on the loop without waiting (background tasks)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def stop(self, timeout_s: float = 5.0) -> None:
        if not self._thread.is_alive():
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.run(cancel_all(), timeout_s)
        except (TimeoutError, RuntimeError):
            logger.warning("broker loop tasks did not finish cancelling in %.1fs", timeout_s)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
