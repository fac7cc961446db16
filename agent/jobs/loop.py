"""The one claim loop, for every job kind: claim the next job of the kind, run it, claim
again; with nothing to do, wait for the poll interval or a wake-up from the kind's
notifications (agent/jobs/wakeups.py), which only cut the latency: polling alone stays
correct. The agent runs one for artifact jobs, the runtime worker one for its kinds.

* **In flight**: up to `in_flight` jobs run at once, each as its own task; the loop
  claims only while there is room, so no lease is taken that no one works on. One
  (the default) runs the jobs one after the other.
* **Refusals**: a refused claim is logged once per episode (the agent's publisher
  reports refusals of the credential); on 401/403 the loop backs off to
  `REFUSED_BACKOFF` polls, as no claim will succeed until the node's standing changes.
* **Anything else** that a claim raises (a bug, or a lease this node cannot take on)
  is logged with its traceback once per episode and backed off the same way: the loop
  is the node's only way to get work, so nothing a claim does may end it.
* **Stop**: when `stop` is set, or the loop is cancelled, the jobs still running are
  cancelled with it: their leases expire and the next attempt does the work.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from agent.errors import Rejected, RequestFailed, log_unexpected
from agent.jobs.wakeups import wait_for_wake

logger = logging.getLogger("modelforge.agent.jobs")


class Job(Protocol):
    """A claimed job, ready to run under its lease (agent/jobs/lease.py: LeasedJob)."""

    name: str

    async def run(self) -> str: ...


# Polls between claims while the credential or the node is refused (401/403).
REFUSED_BACKOFF = 3


async def claim_loop(
    what: str,
    claim: Callable[[], Awaitable[Job | None]],
    stop: asyncio.Event,
    *,
    poll_s: float,
    wake: asyncio.Event | None = None,
    in_flight: int = 1,
    between: Callable[[], Awaitable[object]] | None = None,
) -> None:
    """Claim `what` (e.g. "artifact jobs") until `stop`: `claim` asks for the next one,
    and makes it ready to run. `between` runs before each claim while no job runs (the
    artifact staging sweep)."""
    wake = wake or asyncio.Event()
    room = asyncio.Semaphore(in_flight)
    running: set[asyncio.Task[str]] = set()
    failing: str | None = None

    def ended(task: asyncio.Task[str]) -> None:
        running.discard(task)
        room.release()
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log_unexpected(logger, f"{what}: a job ended with an error", error)

    try:
        while not stop.is_set():
            if not await _acquire(room, stop):
                break
            if between is not None and not running:
                await between()
            claimed = None
            try:
                claimed = await claim()
                failing = None
            except RequestFailed as exc:
                kind = type(exc).__name__
                if failing != kind:
                    logger.warning("claiming %s failed (%s); polling on", what, exc)
                failing = kind
                if isinstance(exc, Rejected) and exc.status in (401, 403):
                    room.release()
                    await wait_for_wake(stop, wake, poll_s * REFUSED_BACKOFF)
                    continue
            except Exception as exc:
                kind = f"unexpected {type(exc).__name__}"
                if failing != kind:
                    log_unexpected(logger, f"claiming {what} raised; backing off", exc)
                failing = kind
                room.release()
                await wait_for_wake(stop, wake, poll_s * REFUSED_BACKOFF)
                continue
            if claimed is None:
                room.release()
                await wait_for_wake(stop, wake, poll_s)
                continue
            task = asyncio.create_task(claimed.run())
            running.add(task)
            task.add_done_callback(ended)
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


async def _acquire(room: asyncio.Semaphore, stop: asyncio.Event) -> bool:
    """A place for one more job, or False once `stop` is set."""
    if not room.locked():
        await room.acquire()
        return True
    acquiring = asyncio.ensure_future(room.acquire())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([acquiring, stopping], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not acquiring.done():
            acquiring.cancel()
    if acquiring.done() and not acquiring.cancelled():
        if stop.is_set():
            room.release()
            return False
        return True
    return False
