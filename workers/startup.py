"""A worker's start waits for JetStream instead of exiting.

On a cluster that is electing a leader, or has lost quorum, every JetStream API call of
the start (the streams, then each queue's consumer) times out or is refused as
unavailable. Exiting then turned a passing condition into a crash loop of whoever
restarts the worker (`modelforge up` stopped the whole stack on it). The start is
retried instead, with the capped full-jitter backoff of every other retry here
(agent/retry.py), until it succeeds, fails in a way that waiting does not mend, or the
process is asked to stop. Once running, the relay, the consumers and dramatiq's own
consumer threads ride out an outage by themselves.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_never

from agent.retry import backoff_s
from broker.jetstream.errors import unavailable

logger = logging.getLogger("modelforge.workers")
T = TypeVar("T")


def wait_for_jetstream(
    start: Callable[[], T],
    stop: threading.Event,
    *,
    initial_s: float,
    max_s: float,
) -> T | None:
    """start() until it returns; None once stop is set first.

    A failure that unavailable() calls passing is logged as one line (no traceback) and
    retried after backoff_s (full jitter, bound doubling from initial_s up to max_s);
    any other failure is raised at once."""

    def wait(state: RetryCallState) -> float:
        return backoff_s(state.attempt_number, initial_s=initial_s, max_s=max_s)

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        logger.warning(
            "JetStream is not ready (%s); trying again in %.1fs (attempt %d)",
            error,
            delay,
            state.attempt_number + 1,
        )

    def sleep(seconds: float) -> None:
        # A stop request ends the wait at once; the next attempt then returns None.
        stop.wait(seconds)

    retrying = Retrying(
        retry=retry_if_exception(unavailable),
        stop=stop_never,
        wait=wait,
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
    for attempt in retrying:
        with attempt:
            if stop.is_set():
                return None
            return start()
    raise AssertionError("unreachable: tenacity returns or raises")  # pragma: no cover
