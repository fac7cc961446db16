"""Keeping full garbage collections short: what survives a long one is frozen.

A full collection walks every tracked object in the oldest generation with the event
loop stopped. What the API started with is frozen at startup (api/server.py), but a
fleet adds its own long-lived objects afterwards: 10,000 nodes' cache entries, their
buffered heartbeats, their streams' state, pools and caches that filled under load.
At 10,000 nodes that was a full collection every two seconds or so, 160 ms each: the
fleet's telemetry p99 (ops/bench/README.md).

So after a full collection that stopped the loop for longer than `long_pause_s`, what
survived it (the live heap, with the garbage just collected) is frozen too: later full
collections walk only what came since. Frozen objects are still freed when their last
reference goes; only a reference cycle among them would stay until they are thawed.
That is bounded: at most once per `thaw_after_s` the heap is thawed, so the next full
collection walks (and cleans) everything once, and freezes what it found alive.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

logger = logging.getLogger("modelforge.api.heap")

LONG_PAUSE_S = 0.02
THAW_AFTER_S = 3600.0


class HeapKeeper:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        long_pause_s: float = LONG_PAUSE_S,
        thaw_after_s: float = THAW_AFTER_S,
    ) -> None:
        self._loop = loop
        self._long_pause_s = long_pause_s
        self._thaw_after_s = thaw_after_s
        self._started = 0.0
        self._thawed_at = time.monotonic()
        self.freezes = 0

    def install(self) -> None:
        gc.callbacks.append(self._on_gc)

    def remove(self) -> None:
        gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if int(info["generation"]) != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause_s = time.perf_counter() - self._started
        if pause_s > self._long_pause_s:
            # Not from inside the collector's callback: on the loop, as soon as it runs
            # (a collection may also run on another thread).
            self._loop.call_soon_threadsafe(self._after_long_collection, pause_s)

    def _after_long_collection(self, pause_s: float) -> None:
        if time.monotonic() - self._thawed_at >= self._thaw_after_s:
            # Thawed: the next full collection walks everything once, and is long, so it
            # freezes again what it found alive.
            gc.unfreeze()
            self._thawed_at = time.monotonic()
            logger.info("heap thawed after %.0f s frozen", self._thaw_after_s)
            return
        gc.freeze()
        self.freezes += 1
        logger.info(
            "a full collection took %.0f ms: %d objects frozen now",
            pause_s * 1e3,
            gc.get_freeze_count(),
        )
