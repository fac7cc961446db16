"""Messages handed to dramatiq and not yet settled, and the +WPI heartbeat that keeps them.

Everything here runs on the broker's loop thread only (fetch, ack, nak and the heartbeat
are all coroutines there), so no locks are needed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

from nats.aio.msg import Msg

logger = logging.getLogger(__name__)


class InFlight:
    """Per queue: the delivered messages this process holds (in dramatiq's work queue,
    being processed, or waiting for their ack). Keyed by reply subject, which is unique
    per delivery."""

    def __init__(self) -> None:
        self._by_queue: dict[str, dict[str, Msg]] = {}
        self._changed = asyncio.Condition()

    def count(self, queue_name: str) -> int:
        return len(self._by_queue.get(queue_name, {}))

    def add(self, queue_name: str, msg: Msg) -> None:
        self._by_queue.setdefault(queue_name, {})[msg.reply] = msg

    async def discard(self, queue_name: str, msg: Msg) -> None:
        held = self._by_queue.get(queue_name)
        if held is not None and held.pop(msg.reply, None) is not None:
            async with self._changed:
                self._changed.notify_all()

    async def wait_below(self, queue_name: str, limit: int, timeout_s: float) -> bool:
        """Wait until fewer than limit messages of queue_name are held; False on timeout."""
        async with self._changed:
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self.count(queue_name) < limit), timeout_s
                )
            except TimeoutError:
                return False
        return True

    def __iter__(self) -> Iterator[Msg]:
        for held in self._by_queue.values():
            yield from list(held.values())


class Heartbeat:
    """Sends +WPI (in progress) for every held message every interval_s.

    Without it a message whose actor runs longer than ack_wait, or which waits in
    dramatiq's work queue behind slow ones, would be redelivered to another worker
    while this one still runs it. A worker that dies stops the heartbeat, so its
    messages come back after at most ack_wait.
    """

    def __init__(self, inflight: InFlight, interval_s: float) -> None:
        self._inflight = inflight
        self._interval_s = interval_s

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            for msg in self._inflight:
                try:
                    await msg.in_progress()
                except Exception as exc:  # a closed connection must not end the loop
                    logger.debug("in_progress failed for %s: %s", msg.reply, exc)
