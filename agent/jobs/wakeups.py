"""The agent's end of the job notification channel: one held server-sent-events request
to the API (schemas/protocol.py: NOTIFICATIONS). Every `event: job` wakes the job loop,
which claims at once; while the channel is down (API restarting, NATS down, a proxy that
cuts long requests) the loop's polling carries on alone, so nothing depends on it."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import httpx

from agent.client import ProtocolClient
from schemas.protocol import NOTIFICATIONS

logger = logging.getLogger("modelforge.agent.jobs")

# Longer than the server's keep-alive interval (15 s): silence beyond it is a dead stream.
READ_TIMEOUT_S = 40.0


async def listen(client: ProtocolClient, wake: asyncio.Event, stop: asyncio.Event) -> None:
    delay = 0.5
    announced = False
    while not stop.is_set():
        try:
            await _hold(client, wake)
            delay = 0.5
        except (httpx.HTTPError, _Refused) as exc:
            if not announced:
                logger.info("job notifications unavailable (%s); polling", type(exc).__name__)
                announced = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        delay = min(delay * 2, 30.0)


class _Refused(Exception):
    pass


async def _hold(client: ProtocolClient, wake: asyncio.Event) -> None:
    headers = {"Authorization": f"Bearer {client.credential}", "Accept": "text/event-stream"}
    timeout = httpx.Timeout(10.0, read=READ_TIMEOUT_S)
    async with client.http.stream("GET", NOTIFICATIONS, headers=headers, timeout=timeout) as r:
        if r.status_code != 200:
            raise _Refused(f"HTTP {r.status_code}")
        logger.info("job notifications: listening")
        wake.set()  # anything created while the channel was down: claim now
        async for line in r.aiter_lines():
            if line == "event: job":
                wake.set()


async def wait_for_wake(stop: asyncio.Event, wake: asyncio.Event, seconds: float) -> None:
    """Until stop or wake is set, or `seconds` pass; then clear wake for the next round."""
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED), seconds)
    for waiter in waiters:
        waiter.cancel()
    wake.clear()
