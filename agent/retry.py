"""The one retry policy: tenacity, exponential backoff with full jitter, transient only.

Transient = transport errors (DNS, refused, TLS, timeout, reset), 5xx and 429; a 429 or
503's Retry-After is honoured (capped). Everything else is raised at once. With
max_attempts, the last Transient is raised once that many calls failed: the caller drops
the payload instead of retrying it forever. Each retry is logged as one failure line
(agent/diagnostics.py). The waits end early, and nothing more is sent, once the stop
event is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    stop_never,
)

from agent.diagnostics import failure_line
from agent.errors import RequestFailed, Transient

logger = logging.getLogger("modelforge.agent")
T = TypeVar("T")


class Stopped(Exception):
    """The stop event was set: nothing more is sent."""


def backoff_s(failures: int, *, initial_s: float, max_s: float) -> float:
    """Full jitter after `failures` failures in a row: uniform in [0, initial_s * 2**(n-1)],
    the bound capped at max_s."""
    # The exponent is capped so that a long outage cannot overflow the float.
    return random.uniform(0, min(max_s, initial_s * 2.0 ** min(max(failures - 1, 0), 64)))


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
    max_attempts: int | None = None,
    earlier_failures: int = 0,
) -> T:
    """call() until it succeeds, fails other than transiently, or max_attempts calls failed
    transiently (that last Transient is raised; None: no bound); Stopped once stop is set.

    earlier_failures: transient failures in a row before this call (earlier payloads of the
    same stream), so the backoff keeps growing across payloads: a long outage must not
    turn into a burst of quick retries for every payload.
    """

    def wait(state: RetryCallState) -> float:
        failures = earlier_failures + state.attempt_number
        delay = backoff_s(failures, initial_s=initial_s, max_s=max_s)
        error = state.outcome.exception() if state.outcome else None
        if isinstance(error, Transient) and error.retry_after_s is not None:
            return max(delay, min(error.retry_after_s, max_s))
        return delay

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        if isinstance(error, RequestFailed):
            of = f" of {max_attempts}" if max_attempts is not None else ""
            outcome = f"retrying in {delay:.1f}s (attempt {state.attempt_number + 1}{of})"
            logger.warning("%s%s", prefix, failure_line(operation, error, outcome))

    async def sleep(seconds: float) -> None:
        await interruptible_sleep(stop, seconds)

    retrying = AsyncRetrying(
        retry=retry_if_exception_type(Transient),
        stop=stop_after_attempt(max_attempts) if max_attempts is not None else stop_never,
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
