"""A periodic step (the heartbeat buffer's flush, the gateway's usage and measurements,
the routing table read ahead) run for the span of a lifespan: started on entry, told to
stop on exit and awaited, so that a writer's last window is written before the lifespan
goes on to close the database."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

# What a step that talks to the database meets while it is away: said by kind only.
EXPECTED = (SQLAlchemyError, OSError)


@contextlib.asynccontextmanager
async def running(
    run: Callable[[asyncio.Event], Coroutine[Any, Any, None]], name: str
) -> AsyncIterator[None]:
    """`run(stop)` as a task named `name` until the block ends; then `stop` is set and
    the task awaited (its own errors are its to handle: one that escapes is raised here)."""
    stop = asyncio.Event()
    task = asyncio.create_task(run(stop), name=name)
    try:
        yield
    finally:
        stop.set()
        await task


class Outage:
    """One warning when a repeated step starts failing and one line when it works again,
    not one per try. An expected error is named by its kind only: its text may hold the
    database's URL or a statement's values."""

    def __init__(self, logger: logging.Logger, subject: str, back: str) -> None:
        self._logger = logger
        self._subject = subject
        self._back = back
        self.failing = False

    def failed(self, exc: BaseException, what: str = "failed") -> None:
        if not self.failing:
            if isinstance(exc, EXPECTED):
                kind = type(exc).__name__
                self._logger.warning("%s %s (%s); retrying", self._subject, what, kind)
            else:  # a defect, not an outage: where it happened is worth the lines
                self._logger.error("%s %s; retrying", self._subject, what, exc_info=exc)
        self.failing = True

    def worked(self) -> None:
        if self.failing:
            self._logger.info("%s %s", self._subject, self._back)
        self.failing = False


async def repeat(
    step: Callable[[], Awaitable[int]],
    stop: asyncio.Event,
    period_s: float,
    outage: Outage,
    *,
    after_stop: bool,
    what: str = "failed",
) -> None:
    """`step()` every `period_s` until `stop`, and with `after_stop` once more after it
    (a writer's last window). `step` says how much it did: 0 proves nothing about the
    database, so it ends no outage. Whatever it raises is logged through `outage` and
    the loop goes on: a loop that died here would stop liveness or metering silently."""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period_s)
        # As it was before this step began: a stop that comes during a writer's step
        # leaves what was counted meanwhile to one more.
        stopping = stop.is_set()
        if stopping and not after_stop:
            return
        try:
            if await step():
                outage.worked()
        except Exception as exc:
            outage.failed(exc, what)
        if stopping:
            return
