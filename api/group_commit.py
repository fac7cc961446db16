"""Group commit: requests that each need a transaction share one instead.

A request hands its item to `submit` and waits; one writer task takes every item that
arrived and writes them in one transaction, and each request gets its own outcome.
Items that arrive while a batch is being written go into the next one, so an idle API
writes an item at once (a batch of one) and a busy one writes hundreds per transaction,
with no timer and no delay beyond the batch in flight. Used by telemetry
(api/telemetry_batch.py) and by the heartbeats of returning nodes
(api/return_batch.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

Item = TypeVar("Item")
Outcome = TypeVar("Outcome")

# Writes a batch in one transaction: an outcome (or the exception that request raises)
# per item, in order. Raising fails every request of the batch with that exception.
Write = Callable[[list[Item]], Awaitable[Sequence[Outcome | Exception]]]


@dataclass
class _Waiting(Generic[Item, Outcome]):
    item: Item
    answer: asyncio.Future[Outcome]


class GroupCommit(Generic[Item, Outcome]):
    def __init__(self, write: Write[Item, Outcome], max_batch: int) -> None:
        self._write = write
        # Items per transaction at most (the rows it locks, the statement's parameters).
        self._max_batch = max_batch
        self._waiting: list[_Waiting[Item, Outcome]] = []
        self._arrived = asyncio.Event()

    async def submit(self, item: Item) -> Outcome:
        """The item's outcome once its batch committed, or what the write raised."""
        answer: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(item, answer))
        self._arrived.set()
        return await answer

    async def run(self) -> None:
        while True:
            await self._arrived.wait()
            self._arrived.clear()
            while self._waiting:
                batch = self._waiting[: self._max_batch]
                del self._waiting[: self._max_batch]
                await self._answer(batch)

    async def _answer(self, batch: list[_Waiting[Item, Outcome]]) -> None:
        try:
            outcomes = await self._write([waiting.item for waiting in batch])
        except Exception as exc:  # every request of the batch answers with it
            for waiting in batch:
                if not waiting.answer.done():
                    waiting.answer.set_exception(exc)
            return
        for waiting, outcome in zip(batch, outcomes, strict=True):
            if waiting.answer.done():
                continue  # its request was cancelled (the client went away)
            if isinstance(outcome, Exception):
                waiting.answer.set_exception(outcome)
            else:
                waiting.answer.set_result(outcome)
