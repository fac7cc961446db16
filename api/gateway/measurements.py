"""The gateway's own measurements per served model, for autoscale (store/services/
reconcile.py): kept in this process, written to PostgreSQL every few seconds.

On the request path only counters and a bounded deque move (api/gateway/call.py):
an invoke begins (once its routes are known) and ends (its answer whole, its stream
closed, or it failed), a failure is counted, a stream's first chunk gives a time to
first token (arrival to first chunk: the gateway's queue and the node's both). A plain
answer gives none: its first byte comes once it is whole, a time the completion's
length rules more than the load.

A task of the API's lifespan writes every model with something to say in one statement
(store/services/measurements.py: write): in flight now, started and failed since the
last write, and the p50 and p90 of the streams' times to first token of the last
TTFT_WINDOW_S (at most SAMPLES of them). A write that fails loses that window's counts,
never a request. The process's rows are deleted when it stops; a process that dies
leaves rows the read side stops counting once they are stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter, deque
from collections.abc import AsyncIterator

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.periodic import Outage, repeat, running
from store.services import measurements as store
from store.services.measurements import Window

logger = logging.getLogger("modelforge.api.gateway.measurements")

# The times to first token a window's percentiles come from: the last this many
# seconds, at most this many samples (the oldest dropped first).
TTFT_WINDOW_S = 30.0
SAMPLES = 256
# Every this many writes, rows of processes long gone are pruned.
PRUNE_EVERY = 60


def percentile(ordered: list[float], q: float) -> float:
    """Nearest rank of a sorted, non-empty list."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class GatewayMeasurements:
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], instance: str, interval_s: float
    ) -> None:
        self._sessions = sessions
        self.instance = instance
        self.interval_s = interval_s
        # Invokes begun and not ended, per served model (every replica).
        self.in_flight: Counter[str] = Counter()
        self._started: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._ttft: dict[str, deque[tuple[float, float]]] = {}
        # Models written last time: written once more when idle, so their in flight
        # reads 0 at once rather than when the row goes stale.
        self._written: set[str] = set()
        self._since = time.monotonic()
        self._writes = 0

    # ------------------------------------------------------------------ request path

    def began(self, model: str) -> None:
        self.in_flight[model] += 1
        self._started[model] += 1

    def ended(self, model: str) -> None:
        self.in_flight[model] -= 1

    def failed(self, model: str) -> None:
        self._errors[model] += 1

    def first_token(self, model: str, seconds: float) -> None:
        samples = self._ttft.get(model)
        if samples is None:
            samples = self._ttft[model] = deque(maxlen=SAMPLES)
        samples.append((time.monotonic(), seconds))

    # ------------------------------------------------------------------ the window

    def window(self) -> list[Window]:
        """What to write now, and a new window begun (no await: nothing moves meanwhile)."""
        now = time.monotonic()
        window_s = now - self._since
        self._since = now
        started, self._started = self._started, Counter()
        errors, self._errors = self._errors, Counter()
        for model in [m for m, n in self.in_flight.items() if n == 0]:
            del self.in_flight[model]
        timed: dict[str, list[float]] = {}
        for model, samples in list(self._ttft.items()):
            while samples and samples[0][0] < now - TTFT_WINDOW_S:
                samples.popleft()
            if samples:
                timed[model] = sorted(seconds for _, seconds in samples)
            else:
                del self._ttft[model]
        models = set(started) | set(errors) | set(self.in_flight) | set(timed) | self._written
        self._written = models - _idle(models, started, errors, self.in_flight, timed)
        windows = []
        for model in sorted(models):
            ttft = timed.get(model, [])
            windows.append(
                Window(
                    model=model,
                    window_s=window_s,
                    in_flight=max(0, self.in_flight.get(model, 0)),
                    started=started.get(model, 0),
                    errors=errors.get(model, 0),
                    ttft_count=len(ttft),
                    ttft_p50_s=percentile(ttft, 0.5) if ttft else None,
                    ttft_p90_s=percentile(ttft, 0.9) if ttft else None,
                )
            )
        return windows

    async def flush(self) -> int:
        """Write the window; how many models it held."""
        windows = self.window()
        if not windows:
            return 0
        self._writes += 1
        async with self._sessions() as session, session.begin():
            await store.write(session, self.instance, windows)
            if self._writes % PRUNE_EVERY == 1:
                await store.prune(session)
        return len(windows)

    async def run(self, stop: asyncio.Event) -> None:
        outage = Outage(logger, "gateway measurements", "are written again")
        await repeat(self.flush, stop, self.interval_s, outage, after_stop=True, what="not written")

    async def forget(self) -> None:
        async with self._sessions() as session, session.begin():
            await store.forget(session, self.instance)


def _idle(
    models: set[str],
    started: Counter[str],
    errors: Counter[str],
    in_flight: Counter[str],
    timed: dict[str, list[float]],
) -> set[str]:
    """Models with nothing in this window: written this once, not the next time."""
    return {m for m in models if not (started[m] or errors[m] or in_flight.get(m) or m in timed)}


@contextlib.asynccontextmanager
async def gateway_measurements(
    sessions: async_sessionmaker[AsyncSession], instance: str, interval_s: float
) -> AsyncIterator[GatewayMeasurements]:
    """Written every `interval_s` for the lifespan; this process's rows deleted at the end."""
    measured = GatewayMeasurements(sessions, instance, interval_s)
    try:
        async with running(measured.run, "gateway-measurements"):
            yield measured
    finally:
        with contextlib.suppress(SQLAlchemyError, OSError):
            await measured.forget()
