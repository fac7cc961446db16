"""How late this API process's event loop runs, and what garbage collection costs it.

Every request of a process waits for one event loop: a synchronous stretch anywhere (a
full garbage collection, a large batch decided in Python, a blocking call) delays every
heartbeat in flight by as much. The request latency histogram shows that only as a tail;
these two say where it came from:

* `modelforge_event_loop_lag_seconds`: how much later than asked a 100 ms sleep wakes;
* `modelforge_gc_pause_seconds{generation}`: each collection's pause, by generation.

The collector's callbacks are the interpreter's (gc.callbacks): installed for the
lifespan of the app and removed with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

from api.background import background

PERIOD_S = 0.1
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class LoopHealth:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.lag = Histogram(
            "modelforge_event_loop_lag_seconds",
            f"How much later than asked a {PERIOD_S * 1000:.0f} ms sleep of the API's event"
            " loop woke up",
            buckets=_BUCKETS,
            registry=registry,
        )
        self.gc_pause = Histogram(
            "modelforge_gc_pause_seconds",
            "Garbage collections of the API process, by generation, and how long each stopped it",
            ["generation"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self._pauses = [self.gc_pause.labels(str(generation)) for generation in range(3)]
        self._started = 0.0

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started:
            self._pauses[min(int(info["generation"]), 2)].observe(
                time.perf_counter() - self._started
            )

    async def watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time()
            await asyncio.sleep(PERIOD_S)
            self.lag.observe(max(0.0, loop.time() - asked - PERIOD_S))


@contextlib.asynccontextmanager
async def loop_health(registry: CollectorRegistry) -> AsyncIterator[LoopHealth]:
    health = LoopHealth(registry)
    gc.callbacks.append(health.on_gc)
    try:
        async with background(health.watch(), "loop-health"):
            yield health
    finally:
        gc.callbacks.remove(health.on_gc)
