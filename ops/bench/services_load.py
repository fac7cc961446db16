"""The services bench's clients (ops/bench/services.py): streamed chat completions through
the gateway, read as raw bytes (no JSON parsing per token, so the generator stays cheap).

* `relay_level`: closed-loop streams at one concurrency for a window; the tokens relayed
  and every gap between two tokens as the client saw them. Run in worker processes
  (`relay_in_processes`) so that the generator gets cores of its own.
* `SteadyLoad`: a few clients that retry as the `openai` client does by default (2
  retries, on a connection error, 408, 409, 429 or 5xx before the first byte, with
  its exponential backoff and jitter); it counts requests that failed after those
  retries, and streams cut after their first byte (never retried: the client already
  has part of the answer).
"""

from __future__ import annotations

import asyncio
import random
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

TOKEN = b'"content":"tok'
DONE = b"data: [DONE]"
ERROR = b'"error"'
RETRY_STATUSES = frozenset({408, 409, 429, *range(500, 600)})
# openai-python's defaults (DEFAULT_MAX_RETRIES, INITIAL_RETRY_DELAY, MAX_RETRY_DELAY).
MAX_RETRIES = 2
INITIAL_DELAY_S = 0.5
MAX_DELAY_S = 8.0


def _body(model: str, max_tokens: int) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "bench"}],
            "max_tokens": max_tokens, "stream": True}  # fmt: skip


@dataclass
class Stream:
    status: int
    tokens: int = 0
    done: bool = False
    error: bool = False
    gaps: list[float] = field(default_factory=list)
    # Seconds from the request to its first token.
    ttft: float | None = None


async def stream_once(
    client: httpx.AsyncClient, url: str, secret: str, model: str, max_tokens: int
) -> Stream:
    headers = {"Authorization": f"Bearer {secret}"}
    started = time.perf_counter()
    async with client.stream("POST", url, json=_body(model, max_tokens), headers=headers) as r:
        if r.status_code != 200:
            await r.aread()
            return Stream(r.status_code)
        result = Stream(200)
        last: float | None = None
        tail = b""
        async for chunk in r.aiter_raw():
            now = time.perf_counter()
            count = chunk.count(TOKEN)
            if count:
                if last is not None:
                    result.gaps.append(now - last)
                else:
                    result.ttft = now - started
                result.gaps.extend([0.0] * (count - 1))
                result.tokens += count
                last = now
            if ERROR in chunk:
                result.error = True
            tail = (tail + chunk)[-64:]
        result.done = DONE in tail
        return result


async def _relay(
    url: str, secret: str, model: str, concurrency: int, window_s: float, max_tokens: int
) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency)
    tokens = streams = failed = 0
    gaps: list[float] = []
    ttfts: list[float] = []
    end = time.perf_counter() + window_s
    async with httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) as client:

        async def loop() -> None:
            nonlocal tokens, streams, failed
            while time.perf_counter() < end:
                try:
                    result = await stream_once(client, url, secret, model, max_tokens)
                except httpx.HTTPError:
                    failed += 1
                    continue
                streams += 1
                tokens += result.tokens
                gaps.extend(result.gaps)
                if result.ttft is not None:
                    ttfts.append(result.ttft)
                if result.status != 200 or result.error or not result.done:
                    failed += 1

        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return {"tokens": tokens, "streams": streams, "failed": failed, "gaps": gaps,
            "ttfts": ttfts, "wall": wall}  # fmt: skip


def relay_level(
    url: str, secret: str, model: str, concurrency: int, window_s: float, max_tokens: int
) -> dict[str, Any]:
    """One generator process's share of a level (a picklable entry point)."""
    return asyncio.run(_relay(url, secret, model, concurrency, window_s, max_tokens))


def relay_in_processes(
    pool: ProcessPoolExecutor,
    processes: int,
    url: str,
    secret: str,
    model: str,
    concurrency: int,
    window_s: float,
    max_tokens: int,
) -> dict[str, Any]:
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    futures = [
        pool.submit(relay_level, url, secret, model, share, window_s, max_tokens)
        for share in shares
        if share
    ]
    parts = [f.result() for f in futures]
    return {
        "tokens": sum(p["tokens"] for p in parts),
        "streams": sum(p["streams"] for p in parts),
        "failed": sum(p["failed"] for p in parts),
        "gaps": [g for p in parts for g in p["gaps"]],
        "ttfts": [t for p in parts for t in p["ttfts"]],
        "wall": max(p["wall"] for p in parts),
    }


@dataclass
class Counts:
    requests: int = 0
    retried: int = 0
    failed: int = 0
    cut: int = 0
    nodes: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        return (f"{self.requests} requests, {self.failed} failed after retries, {self.cut} "
                f"cut mid-stream ({self.retried} retries)")  # fmt: skip


class SteadyLoad:
    """`clients` loops of short streamed completions until stopped; `counts` is swapped
    for a fresh one at each phase (`phase()`), so each phase is counted alone."""

    def __init__(
        self, url: str, secret: str, model: str, clients: int = 4, max_tokens: int = 20
    ) -> None:
        self.url, self.secret, self.model = url, secret, model
        self.clients, self.max_tokens = clients, max_tokens
        self.counts = Counts()
        self.stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def phase(self) -> Counts:
        """The counts so far; counting starts again."""
        counts, self.counts = self.counts, Counts()
        return counts

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._loop()) for _ in range(self.clients)]

    async def close(self) -> Counts:
        self.stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        return self.counts

    async def _loop(self) -> None:
        async with httpx.AsyncClient(timeout=60, trust_env=False) as client:
            while not self.stop.is_set():
                await self._request(client)

    async def _request(self, client: httpx.AsyncClient) -> None:
        counts = self.counts
        counts.requests += 1
        for attempt in range(MAX_RETRIES + 1):
            try:
                result = await stream_once(
                    client, self.url, self.secret, self.model, self.max_tokens
                )
            except httpx.TransportError:
                result = None
            if result is not None and result.status == 200:
                if result.error or not result.done:
                    counts.cut += 1
                return
            if result is not None and result.status not in RETRY_STATUSES:
                counts.failed += 1
                return
            if attempt == MAX_RETRIES:
                counts.failed += 1
                return
            counts.retried += 1
            delay = min(INITIAL_DELAY_S * 2**attempt, MAX_DELAY_S)
            await asyncio.sleep(delay * (1 - 0.25 * random.random()))
