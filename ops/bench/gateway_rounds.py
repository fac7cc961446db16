"""The rounds of ops/bench/gateway.py: one streamed request timed to its first token, a
closed-loop round (N requests, at most C in flight: a client sends its next request when
its last one ends) and an open-loop round (requests sent at a schedule of Poisson
arrivals, whatever is in flight), and what a side's rounds add up to.

Why both. In a closed loop of identical requests sent to llama-server directly, the C
requests of a wave reach it within a millisecond and share its batches, and they end
together, so the next wave does too. Through the gateway they arrive a few ms apart, which
can change how llama-server batches them: at C > 1 the two sides need not be the same
workload for it. The open loop gives both sides the same arrival times, as clients that
do not wait on each other. Its own limit: under queueing the TTFT spread is wide (p99 of
1-2 s at 0.5-0.8 of capacity on the 2-core box, 2026-12-06), so a p99 difference there is
noise unless a round holds far more requests than the closed loop needs.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from schemas.protocol import ROUTE_OVERHEAD_HEADER

Target = tuple[str, dict[str, str], dict[str, Any]]


@dataclass(frozen=True)
class Direct:
    """llama-server called directly: its URL, and the runtime worker's key when it is the
    deployment's own server (the worker starts it with `--api-key-file`)."""

    url: str
    key: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def target(self, path: str, body: dict[str, Any]) -> Target:
        return (f"{self.url}{path}", self.headers, body)


@dataclass
class Result:
    ttft: float | None
    total: float
    tokens: int
    error: str | None = None
    # The gateway's own receipt: arrival to delivery on the runtime channel, in ms.
    overhead_ms: float | None = None
    # What the first token was: "content" or "tool_calls".
    first: str | None = None


async def one(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict[str, Any]
) -> Result:
    started = time.perf_counter()
    ttft: float | None = None
    tokens = 0
    first: str | None = None
    async with client.stream("POST", url, json=body, headers=headers) as response:
        receipt = response.headers.get(ROUTE_OVERHEAD_HEADER)
        overhead_ms = float(receipt) if receipt else None
        if response.status_code != 200:
            await response.aread()
            return Result(None, time.perf_counter() - started, 0, str(response.status_code))
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                error = f"stream error: {json.dumps(chunk['error'])[:200]}"
                return Result(ttft, time.perf_counter() - started, tokens, error)
            choices = chunk.get("choices") or [{}]
            delta = choices[0].get("delta") or {}
            # A tool call's deltas are tokens as content's are (design note §8).
            kind = next((k for k in ("content", "tool_calls") if delta.get(k)), None)
            if kind is not None:
                tokens += 1
                if ttft is None:
                    ttft, first = time.perf_counter() - started, kind
    total = time.perf_counter() - started
    return Result(ttft, total, tokens, overhead_ms=overhead_ms, first=first)


def pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


@dataclass
class Side:
    results: list[Result] = field(default_factory=list)
    wall: float = 0.0
    cpu: float = 0.0
    # Each round's TTFT p50: two rounds of the same side apart say how loud the box is.
    round_p50s: list[float] = field(default_factory=list)
    # The API's event loop woken late by more than LATE_S, and its collections longer
    # than LONG_GC_S, during this side's rounds: what a tail of the gateway's came from.
    late_wakes: float = 0.0
    long_gcs: float = 0.0

    def ttfts_ms(self) -> list[float]:
        return [r.ttft * 1000 for r in self.results if r.ttft is not None and not r.error]

    def overheads_ms(self) -> list[float]:
        return [r.overhead_ms for r in self.results if r.overhead_ms is not None]

    def errors(self) -> int:
        return sum(1 for r in self.results if r.error)

    def tokens_per_s(self) -> float:
        return sum(r.tokens for r in self.results) / self.wall

    def tokens_per_request(self) -> float:
        served = [r.tokens for r in self.results if not r.error]
        return statistics.mean(served) if served else 0.0

    def invokes_per_s(self) -> float:
        return (len(self.results) - self.errors()) / self.wall

    def firsts(self, kind: str) -> int:
        return sum(1 for r in self.results if r.first == kind)

    def in_flight(self) -> float:
        """The mean number of requests in flight over the rounds' wall time."""
        return sum(r.total for r in self.results) / self.wall


LATE_S, LONG_GC_S = "0.05", "0.025"  # bucket bounds of api/loop_health.py


async def stalls(client: httpx.AsyncClient, api: str) -> tuple[float, float]:
    """(wakes later than LATE_S, collections longer than LONG_GC_S) so far, from the API
    process's own histograms (api/loop_health.py) on its /metrics."""
    response = await client.get(f"{api}/metrics")
    response.raise_for_status()
    late = gcs = 0.0
    for family in text_string_to_metric_families(response.text):
        if family.name not in ("modelforge_event_loop_lag_seconds", "modelforge_gc_pause_seconds"):
            continue
        bound = LATE_S if family.name.startswith("modelforge_event") else LONG_GC_S
        over = sum(s.value for s in family.samples if s.name.endswith("_count")) - sum(
            s.value for s in family.samples
            if s.name.endswith("_bucket") and s.labels.get("le") == bound
        )  # fmt: skip
        if family.name.startswith("modelforge_event"):
            late = over
        else:
            gcs = over
    return late, gcs


async def _timed(client: httpx.AsyncClient, target: Target) -> Result:
    url, headers, body = target
    try:
        return await one(client, url, headers, body)
    except httpx.HTTPError as error:
        return Result(None, 0.0, 0, type(error).__name__)


async def run_round(
    client: httpx.AsyncClient, target: Target, n: int, concurrency: int
) -> tuple[list[Result], float]:
    """Closed loop: `n` requests, `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def bounded() -> Result:
        async with gate:
            return await _timed(client, target)

    started = time.perf_counter()
    results = await asyncio.gather(*(bounded() for _ in range(n)))
    return list(results), time.perf_counter() - started


def arrivals(rate: float, n: int, seed: int) -> list[float]:
    """`n` Poisson arrivals at `rate` a second: each one's offset from the round's start."""
    draw = random.Random(seed)
    offsets, at = [], 0.0
    for _ in range(n):
        at += draw.expovariate(rate)
        offsets.append(at)
    return offsets


async def run_open(
    client: httpx.AsyncClient, target: Target, offsets: list[float]
) -> tuple[list[Result], float]:
    """Open loop: one request at each offset, however many are in flight. A request's
    TTFT counts from its own send, so a late wake-up of this loop is not in it."""
    started = time.perf_counter()

    async def at(offset: float) -> Result:
        await asyncio.sleep(max(0.0, started + offset - time.perf_counter()))
        return await _timed(client, target)

    results = await asyncio.gather(*(at(offset) for offset in offsets))
    return list(results), time.perf_counter() - started
