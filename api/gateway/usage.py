"""What each service client spent through the gateway, per (UTC minute, client, served
model, outcome): kept in this process, added to PostgreSQL's usage_minutes every
`MODELFORGE_GATEWAY_MEASURE_INTERVAL_S` in one statement (store/rollup/usage.py: add),
counted on `/metrics` per client and model (api/metrics.py), and the day's token
budgets (`max_tokens_per_day`) checked against it.

On the request path only dictionaries move: every invoke gets an `InvokeMeter`
(api/gateway/call.py) that records it exactly once, whatever ends it, in the UTC
minute it ended: "ok", the error code the client got (each refusal, an upstream
failure, a stream cut mid-way), or "client_left". Its tokens are those the node's answer
reported (api/gateway/tally.py); a stream cut short before its usage arrived counts the
content events it relayed, with no prompt tokens (an estimate, so leaving early does not
dodge a budget). A request refused before the route ran (401, a body that fails
validation) has no invoke and is not metered here. The model is
the served model once routing chose one, the name the client asked for before then
(a role, or a model), and OUT_OF_SCOPE for a name the client may not call (its label
set stays the client's scope, whatever it sends).

A flush that fails loses that window's counts, never a request, and is logged once per
outage. The last window is flushed when the process stops.

Budgets: a client is refused (429 budget_exhausted, Retry-After to the next UTC
midnight) once its tokens today reach its budget, as this process knows them: the
database's figure (read on its first call of the day, then again after every flush)
plus what this process counted since. An invoke is counted when it ends, so the ones
admitted while the budget was not yet spent all finish: one process overshoots by at
most what its invokes in flight at that moment spend (each at most its max_tokens plus
its prompt, whatever its node reports: api/gateway/tally.py, bounded). Another
process's tokens are seen once it flushed and this one re-read, within two intervals:
with N processes the overshoot is at most that of each process's own in-flight invokes
plus what the other N-1 spend in two intervals. (A first read of the day that races a
flush may miss that flush's window until the next one.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

from prometheus_client import Counter
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from api.gateway.scope import ClientScope
from api.metrics import ApiMetrics
from api.periodic import Outage, repeat, running
from schemas.usage import OUTCOME_OK, TTFT_BUCKETS_S, empty_buckets, ttft_bucket
from store.rollup import usage as store
from store.rollup.usage import UsageDelta

logger = logging.getLogger("modelforge.api.gateway.usage")

DAY_S = 86_400
OK = OUTCOME_OK
CLIENT_LEFT = "client_left"
# The model a refusal counts under when the client named something outside its scope:
# no served model's name has a space or parentheses.
OUT_OF_SCOPE = "(not in scope)"

# (minute since the epoch, client, model, outcome)
Key = tuple[int, uuid.UUID, str, str]


def seconds_to_midnight(now: float) -> int:
    """Whole seconds to the next UTC midnight, at least 1: a budget's Retry-After."""
    return max(1, DAY_S - int(now) % DAY_S)


class _Counts:
    __slots__ = ("completion", "prompt", "requests", "ttft_buckets", "ttft_count", "ttft_sum")

    def __init__(self) -> None:
        self.requests = 0
        self.prompt = 0
        self.completion = 0
        self.ttft_count = 0
        self.ttft_sum = 0.0
        self.ttft_buckets: list[int] | None = None


class InvokeMeter:
    """One invoke's record: the first `record` counts, every later one is ignored."""

    __slots__ = ("_usage", "client_id", "client_name", "model", "recorded", "ttft_s")

    def __init__(self, usage: GatewayUsage, scope: ClientScope, model: str) -> None:
        self._usage = usage
        self.client_id = scope.client_id
        self.client_name = scope.name
        self.model = model
        self.recorded = False
        # Arrival to the stream's first chunk; None for a plain answer or no chunk.
        self.ttft_s: float | None = None

    def record(self, outcome: str, prompt_tokens: int = 0, completion_tokens: int = 0) -> bool:
        """Count the invoke under `outcome`; False if it was counted already."""
        if self.recorded:
            return False
        self.recorded = True
        self._usage.add(self, outcome, prompt_tokens, completion_tokens)
        return True


class GatewayUsage:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        interval_s: float,
        metrics: ApiMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._sessions = sessions
        self.interval_s = interval_s
        self._metrics = metrics
        self._clock = clock
        self._window: dict[Key, _Counts] = {}
        # Tokens per client counted since the last flush began, and those of the flush
        # under way (until the database's figure includes them), both of `_day`.
        self._day = int(clock() // DAY_S)
        self._spent: dict[uuid.UUID, int] = {}
        self._flushing: dict[uuid.UUID, int] = {}
        # The database's tokens today per budgeted client, as last read.
        self._stored: dict[uuid.UUID, int] = {}
        self._outage = Outage(logger, "gateway usage", "is written again")
        # The counters' labelled children, looked up once each: `labels()` costs more
        # than the rest of a record (ops/bench/usage.py). As bounded as the series.
        self._requests: dict[tuple[str, str, str], Counter] = {}
        self._tokens: dict[tuple[str, str], tuple[Counter, Counter]] = {}

    # ------------------------------------------------------------------ request path

    def meter(self, scope: ClientScope, model: str) -> InvokeMeter:
        return InvokeMeter(self, scope, model if scope.allows(model) else OUT_OF_SCOPE)

    def add(self, meter: InvokeMeter, outcome: str, prompt: int, completion: int) -> None:
        now = self._clock()
        key = (int(now // 60), meter.client_id, meter.model, outcome)
        counts = self._window.get(key)
        if counts is None:
            counts = self._window[key] = _Counts()
        counts.requests += 1
        counts.prompt += prompt
        counts.completion += completion
        if meter.ttft_s is not None:
            counts.ttft_count += 1
            counts.ttft_sum += meter.ttft_s
            if counts.ttft_buckets is None:
                counts.ttft_buckets = [0] * len(TTFT_BUCKETS_S)
            counts.ttft_buckets[ttft_bucket(meter.ttft_s)] += 1
        requests = self._requests.get((meter.client_name, meter.model, outcome))
        if requests is None:
            labels = (meter.client_name, meter.model, outcome)
            requests = self._requests[labels] = self._metrics.client_requests.labels(*labels)
        requests.inc()
        if prompt or completion:
            self._roll(now)
            self._spent[meter.client_id] = self._spent.get(meter.client_id, 0) + prompt + completion
            tokens = self._tokens.get((meter.client_name, meter.model))
            if tokens is None:
                counter = self._metrics.client_tokens
                tokens = self._tokens[(meter.client_name, meter.model)] = (
                    counter.labels(meter.client_name, meter.model, "prompt"),
                    counter.labels(meter.client_name, meter.model, "completion"),
                )
            if prompt:
                tokens[0].inc(prompt)
            if completion:
                tokens[1].inc(completion)

    def _roll(self, now: float) -> None:
        """A new UTC day: yesterday's tokens no longer count against any budget."""
        day = int(now // DAY_S)
        if day != self._day:
            self._day = day
            self._spent.clear()
            self._flushing.clear()
            self._stored.clear()

    async def budget_retry_after(self, scope: ClientScope) -> int | None:
        """None while the client may spend; once its tokens today reach its budget, the
        seconds to the next UTC midnight. The database is read on the client's first
        call of the day here; after that, at every flush."""
        budget = scope.max_tokens_per_day
        if budget is None:
            return None
        now = self._clock()
        self._roll(now)
        client = scope.client_id
        stored = self._stored.get(client)
        if stored is None:
            stored = await self._read_today(client)
        spent = stored + self._flushing.get(client, 0) + self._spent.get(client, 0)
        return seconds_to_midnight(now) if spent >= budget else None

    def known_today(self, client: uuid.UUID) -> int | None:
        """The client's tokens today as this process knows them now (what the budget is
        checked against); None before the database's figure was read."""
        stored = self._stored.get(client)
        if stored is None or self._day != int(self._clock() // DAY_S):
            return None
        return stored + self._flushing.get(client, 0) + self._spent.get(client, 0)

    async def _read_today(self, client: uuid.UUID) -> int:
        day = self._day
        try:
            async with self._sessions() as session, session.begin():
                stored = (await store.tokens_today(session, [client])).get(client, 0)
        except (SQLAlchemyError, OSError) as exc:
            # Budgets are accounting, not access: without the database this process
            # counts what it sees, and reads again after its next flush.
            self._outage.failed(exc, "budget not read, this process's counts only")
            stored = 0
        if day == self._day:
            self._stored[client] = stored
        return stored

    # ------------------------------------------------------------------ the window

    def window(self) -> list[UsageDelta]:
        """The counts since the last call, and a new window begun (no await: nothing
        moves meanwhile). The tokens they hold stay counted for budgets until the
        database's figure is read again (`settled`)."""
        self._roll(self._clock())
        window, self._window = self._window, {}
        for client, tokens in self._spent.items():
            self._flushing[client] = self._flushing.get(client, 0) + tokens
        self._spent = {}
        return [
            UsageDelta(
                minute=datetime.fromtimestamp(minute * 60, UTC),
                client_id=client,
                model=model,
                outcome=outcome,
                requests=c.requests,
                prompt_tokens=c.prompt,
                completion_tokens=c.completion,
                ttft_count=c.ttft_count,
                ttft_sum_s=c.ttft_sum,
                ttft_buckets=tuple(c.ttft_buckets) if c.ttft_buckets else empty_buckets(),
            )
            for (minute, client, model, outcome), c in window.items()
        ]

    def settled(self, budgeted: list[uuid.UUID], stored: dict[uuid.UUID, int] | None) -> None:
        """The flush ended: its tokens are in the database's figure now (`stored`, read
        after the write for the `budgeted` clients), or lost with it (None)."""
        self._flushing.clear()
        if stored is not None:
            for client in budgeted:
                if client in self._stored:
                    self._stored[client] = stored.get(client, 0)

    async def flush(self) -> int:
        """Add the window to usage_minutes in one statement, then read the budgeted
        clients' tokens today again; how many rows the window held."""
        deltas = self.window()
        day = self._day
        budgeted = list(self._stored)
        stored: dict[uuid.UUID, int] | None = None
        try:
            if deltas or budgeted:
                async with self._sessions() as session, session.begin():
                    if deltas:
                        await store.add(session, deltas)
                    if budgeted:
                        stored = await store.tokens_today(session, budgeted)
        finally:
            if day == self._day:
                self.settled(budgeted, stored)
        return len(deltas)

    async def run(self, stop: asyncio.Event) -> None:
        """Flush every interval until `stop`, then once more (the last window). An empty
        window proves nothing about the database: no "again" for it."""
        what = "not written, a window's counts are lost"
        await repeat(self.flush, stop, self.interval_s, self._outage, after_stop=True, what=what)


@contextlib.asynccontextmanager
async def gateway_usage(
    sessions: async_sessionmaker[AsyncSession], interval_s: float, metrics: ApiMetrics
) -> AsyncIterator[GatewayUsage]:
    """Flushed every `interval_s` for the lifespan, and once more at its end."""
    usage = GatewayUsage(sessions, interval_s, metrics)
    async with running(usage.run, "gateway-usage"):
        yield usage
