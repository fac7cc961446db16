"""The write cost of metering the gateway's invokes (issue 33), against baselines
measured in the same run.

    python ops/bench/usage.py [--invokes 200000 --clients 100 --models 3
                               --rate 1000 --interval-s 5 --flushes 20 --writes 500]
    python -m ops.bench.usage

Embedded PostgreSQL (or MODELFORGE_DATABASE_URL), migrated. Then, in this process:

* **meter**: what every invoke pays in the API process (api/gateway/usage.py): its
  `InvokeMeter`, the record into the window of (minute, client, model, outcome), and the
  per-client/model Prometheus counters, over `--invokes` invokes spread over `--clients`
  x `--models` (5 % refusals, half of them streams with a time to first token); per
  invoke, against the **invoke path without metering**: the gateway's own in-process
  work for one invoke (the client's body validated, the Invoke built and dumped to the
  JSON its delivery sends, the existing per-outcome counter);
* **tally**: a stream's usage read as it passes (api/gateway/tally.py), per event,
  against a relay that passes the same chunks unread;
* **flush**: the one statement that adds a window to usage_minutes
  (store/rollup/usage.py: add, in its own transaction, as the flush runs it) for the
  window `--rate` invokes/s leave over `--interval-s` (one row per key seen), each
  flush adding to the rows the last one wrote, `--flushes` times; per invoke (the
  flush's time over the invokes it carried), against **a write per request**: the same
  upsert of one row in a transaction of its own, `--writes` times, what metering
  without the accumulator would cost; and the budget read that follows a flush
  (tokens_today for every client);

and prints each figure, the ratios, and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import heartbeats as hb  # sibling bench module: the embedded database

from api.gateway.scope import ClientScope
from api.gateway.tally import StreamTally
from api.gateway.usage import GatewayUsage
from api.metrics import ApiMetrics
from schemas.gateway import ChatCompletionRequest, Invoke, InvokeParams
from schemas.jobs import LeaseFence
from schemas.usage import empty_buckets
from store.engine import make_engine, make_sessionmaker
from store.rollup import usage as store
from store.rollup.usage import UsageDelta

OUTCOMES = ("rate_limited", "deployment_busy", "no_ready_deployment", "client_left")
BODY = json.dumps({
    "model": "model-0", "max_tokens": 64, "temperature": 0.2, "stream": True,
    "messages": [{"role": "system", "content": "You are terse."},
                 {"role": "user", "content": "Say something about GPUs in one line."}],
}).encode()  # fmt: skip
EVENT = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":0,"model":"m",'
EVENT += b'"choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}]}\n\n'


def _scopes(clients: int, models: int) -> list[ClientScope]:
    names = frozenset(f"model-{m}" for m in range(models))
    return [
        ClientScope(uuid.uuid4(), f"client-{c}", names, frozenset(), None, None)
        for c in range(clients)
    ]


def _outcome(i: int) -> str:
    return OUTCOMES[i % len(OUTCOMES)] if i % 20 == 19 else "ok"


def meter_us(invokes: int, clients: int, models: int) -> float:
    """Per invoke: its meter and record, counters included (µs)."""
    usage = GatewayUsage(None, 5.0, ApiMetrics())  # type: ignore[arg-type]
    scopes = _scopes(clients, models)
    names = [f"model-{m}" for m in range(models)]
    start = time.perf_counter()
    for i in range(invokes):
        meter = usage.meter(scopes[i % clients], names[i % models])
        if i % 2:
            meter.ttft_s = 0.05 + (i % 100) / 100
        outcome = _outcome(i)
        if outcome == "ok":
            meter.record(outcome, 40, 60)
        else:
            meter.record(outcome)
    return (time.perf_counter() - start) / invokes * 1e6


def baseline_us(invokes: int) -> float:
    """Per invoke: the gateway's own in-process work without metering (µs)."""
    metrics = ApiMetrics()
    gateway = uuid.uuid4().hex
    start = time.perf_counter()
    for i in range(invokes):
        body = ChatCompletionRequest.model_validate_json(BODY)
        params = InvokeParams(
            messages=body.messages,
            max_tokens=body.max_tokens or 512,
            temperature=body.temperature,
            stream=body.stream,
            include_usage=body.stream,
        )
        lease = LeaseFence(lease_id=uuid.uuid4(), epoch=1)
        invoke = Invoke(
            invoke_id=uuid.uuid4(),
            deployment_id=uuid.uuid4(),
            gateway=gateway,
            lease=lease,
            params=params,
        )
        invoke.model_dump_json()
        metrics.invokes.labels(_outcome(i), "true", "chat").inc()
    return (time.perf_counter() - start) / invokes * 1e6


def tally_us(events: int) -> tuple[float, float]:
    """Per event: a stream read for its usage, and the same chunks passed unread (µs)."""
    tally = StreamTally(strip_usage=True)
    start = time.perf_counter()
    for _ in range(events):
        tally.feed(EVENT)
    read = time.perf_counter() - start
    sink: list[bytes] = []
    start = time.perf_counter()
    for _ in range(events):
        sink.append(EVENT)
        sink.clear()
    unread = time.perf_counter() - start
    return read / events * 1e6, unread / events * 1e6


def _window(scopes: list[ClientScope], models: int, invokes: int) -> list[UsageDelta]:
    """The window `invokes` invokes leave: one row per (client, model, outcome) seen."""
    minute = datetime.now(UTC).replace(second=0, microsecond=0)
    counts: dict[tuple[int, int, str], int] = {}
    for i in range(invokes):
        key = (i % len(scopes), i % models, _outcome(i))
        counts[key] = counts.get(key, 0) + 1
    return [
        UsageDelta(
            minute=minute,
            client_id=scopes[c].client_id,
            model=f"model-{m}",
            outcome=outcome,
            requests=n,
            prompt_tokens=40 * n if outcome == "ok" else 0,
            completion_tokens=60 * n if outcome == "ok" else 0,
            ttft_count=n // 2,
            ttft_sum_s=0.3 * (n // 2),
            ttft_buckets=empty_buckets(),
        )
        for (c, m, outcome), n in counts.items()
    ]


async def _database_figures(
    url: str, clients: int, models: int, per_flush: int, flushes: int, writes: int
) -> dict[str, Any]:
    engine = make_engine(url, pool_size=2)
    sessions = make_sessionmaker(engine)
    scopes = _scopes(clients, models)
    window = _window(scopes, models, per_flush)
    try:
        for _ in range(2):  # warm: the connection, the plan, the rows exist
            async with sessions() as session, session.begin():
                await store.add(session, window)
        flush_ms: list[float] = []
        for _ in range(flushes):
            start = time.perf_counter()
            async with sessions() as session, session.begin():
                await store.add(session, window)
            flush_ms.append((time.perf_counter() - start) * 1000)
        single: list[float] = []
        for i in range(writes):
            delta = window[i % len(window)]
            start = time.perf_counter()
            async with sessions() as session, session.begin():
                await store.add(session, [delta])
            single.append((time.perf_counter() - start) * 1000)
        read_ms: list[float] = []
        for _ in range(flushes):
            start = time.perf_counter()
            async with sessions() as session, session.begin():
                await store.tokens_today(session, [s.client_id for s in scopes])
            read_ms.append((time.perf_counter() - start) * 1000)
    finally:
        await engine.dispose()
    flush_p50 = statistics.median(flush_ms)
    write_p50 = statistics.median(single)
    return {
        "flush_rows": len(window),
        "flush_invokes": per_flush,
        "flush_p50_ms": round(flush_p50, 2),
        "flush_max_ms": round(max(flush_ms), 2),
        "flush_per_invoke_us": round(flush_p50 / per_flush * 1000, 3),
        "write_per_request_p50_ms": round(write_p50, 3),
        "flush_vs_write_per_request": round(flush_p50 / per_flush / write_p50, 5),
        "budget_read_p50_ms": round(statistics.median(read_ms), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--invokes", type=int, default=200_000)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--models", type=int, default=3)
    parser.add_argument("--rate", type=float, default=1000.0, help="invokes/s the flush carries")
    parser.add_argument("--interval-s", type=float, default=5.0)
    parser.add_argument("--flushes", type=int, default=20)
    parser.add_argument("--writes", type=int, default=500)
    args = parser.parse_args()
    # Each twice, the better kept: the first pays the imports' and the caches' warm-up.
    meter = min(meter_us(args.invokes, args.clients, args.models) for _ in range(2))
    baseline = min(baseline_us(args.invokes // 4) for _ in range(2))
    read, unread = min(tally_us(args.invokes) for _ in range(2))
    per_flush = max(1, int(args.rate * args.interval_s))
    with (
        tempfile.TemporaryDirectory(prefix="mf-usage-") as workdir,
        hb.database(Path(workdir), durable=True) as (url, _),
    ):
        database = asyncio.run(
            _database_figures(url, args.clients, args.models, per_flush, args.flushes, args.writes)
        )
    figures = {
        "meter_per_invoke_us": round(meter, 3),
        "invoke_path_without_metering_us": round(baseline, 3),
        "meter_vs_invoke_path": round(meter / baseline, 4),
        "tally_per_event_us": round(read, 3),
        "relay_unread_per_event_us": round(unread, 3),
        **database,
    }
    print(json.dumps(figures, indent=2))
    total = meter + database["flush_per_invoke_us"]
    print(
        f"metering per invoke: {figures['meter_per_invoke_us']} µs in the API process"
        f" ({figures['meter_vs_invoke_path']:.1%} of the invoke path's own"
        f" {figures['invoke_path_without_metering_us']} µs without it) +"
        f" {database['flush_per_invoke_us']} µs of the flush ({database['flush_p50_ms']} ms"
        f" for {database['flush_rows']} rows carrying {per_flush} invokes) = {total:.2f} µs;"
        f" a write per request would cost {database['write_per_request_p50_ms'] * 1000:.0f} µs"
        f" (the flush is {database['flush_vs_write_per_request']:.2%} of it); a stream's"
        f" tally {figures['tally_per_event_us']} µs per event; the budget read after a"
        f" flush {database['budget_read_p50_ms']} ms for {args.clients} clients"
    )
    print(f"load average during the run: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
