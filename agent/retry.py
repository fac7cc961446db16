"""The one retry policy: tenacity, exponential backoff with full jitter, transient only.

Transient = transport errors (DNS, refused, TLS, timeout, reset), 5xx and 429; a 429 or
503's Retry-After is honoured (capped). Everything else is raised at once. Each retry is
logged as one failure line (agent/diagnostics.py). The waits end early, and nothing more
is sent, once the stop event is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type
from tenacity.wait import wait_random_exponential

from agent.diagnostics import failure_line
from agent.errors import RequestFailed, Transient

logger = logging.getLogger("modelforge.agent")
T = TypeVar("T")


class Stopped(Exception):
    """The stop event was set: nothing more is sent."""


async def interruptible_sleep(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=max(seconds, 0.0))


async def retry_transient(
    operation: str,
    call: Callable[[], Awaitable[T]],
    *,
    stop: asyncio.Event,
    initial_s: float,
    max_s: float,
    prefix: str = "",
    on_failure: Callable[[RequestFailed], None] | None = None,
) -> T:
    """call() until it succeeds or fails other than transiently; Stopped once stop is set."""
    jitter = wait_random_exponential(multiplier=initial_s, max=max_s)

    def wait(state: RetryCallState) -> float:
        delay = float(jitter(state))
        error = state.outcome.exception() if state.outcome else None
        if isinstance(error, Transient) and error.retry_after_s is not None:
            return max(delay, min(error.retry_after_s, max_s))
        return delay

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        if isinstance(error, RequestFailed):
            outcome = f"retrying in {delay:.1f}s (attempt {state.attempt_number + 1})"
            logger.warning("%s%s", prefix, failure_line(operation, error, outcome))

    async def sleep(seconds: float) -> None:
        await interruptible_sleep(stop, seconds)

    retrying = AsyncRetrying(
        retry=retry_if_exception_type(Transient),
        wait=wait,
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            if stop.is_set():
                raise Stopped
            try:
                return await call()
            except RequestFailed as error:
                if on_failure is not None:
                    on_failure(error)
                raise
    raise AssertionError("unreachable: tenacity returns or raises")  # pragma: no cover
