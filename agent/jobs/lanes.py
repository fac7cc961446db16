"""Two worker threads behind a download: one writes each block to the staged file, the
other feeds it to the digest, both while the event loop receives the next blocks.

Why two lanes and not one `to_thread` per block: writing and hashing each cost about as
much as receiving (ops/bench/jobs.py), so done one after the other they halve the rate;
side by side, and decoupled from the loop by a bounded depth, the download runs at
nearly the speed of its slowest step. Both calls let go of the GIL for blocks this size.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable

# The chunks of one block, as received.
Block = list[bytes]


class Lanes:
    def __init__(self, *steps: Callable[[Block], object], depth: int = 8) -> None:
        self._loop = asyncio.get_running_loop()
        # Each block takes one unit per lane; a lane gives its unit back when done.
        self._room = asyncio.Semaphore(depth * len(steps))
        self._queues: list[queue.SimpleQueue[Block | None]] = [queue.SimpleQueue() for _ in steps]
        self._error: BaseException | None = None
        self._threads = [
            threading.Thread(target=self._lane, args=(q, step), daemon=True, name="mf-lane")
            for q, step in zip(self._queues, steps, strict=True)
        ]
        # Started from a worker thread (a start waits for the new thread to run, up to a
        # few ms on a busy host), meanwhile the loop goes on: the request is sent.
        self._starting = self._loop.run_in_executor(None, self._start)
        self._started = False

    async def put(self, block: Block) -> None:
        """Hand one block to every lane; waits while `depth` blocks are still in them.
        The block must not be changed afterwards."""
        if not self._started:
            await self._starting
            self._started = True
        self._raise_if_failed()
        for _ in self._queues:
            await self._room.acquire()
        for lane in self._queues:
            lane.put(block)

    async def close(self, then: Callable[[], object] | None = None) -> None:
        """Finish what was handed over, stop the threads, then call `then` (in a worker
        thread, whatever the lanes did); raise a lane's error if any."""
        for lane in self._queues:
            lane.put(None)
        try:
            await self._starting
        finally:
            await asyncio.to_thread(self._join, then)
        self._raise_if_failed()

    def _start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _join(self, then: Callable[[], object] | None) -> None:
        try:
            for thread in self._threads:
                if thread.ident is not None:  # started
                    thread.join()
        finally:
            if then is not None:
                then()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _lane(
        self, blocks: queue.SimpleQueue[Block | None], step: Callable[[Block], object]
    ) -> None:
        while (block := blocks.get()) is not None:
            if self._error is None:  # after an error the rest is only drained
                try:
                    step(block)
                except BaseException as exc:  # handed to the loop by put() or close()
                    self._error = exc
            self._loop.call_soon_threadsafe(self._room.release)
