"""The API's event-loop lag and garbage-collection pauses, read from its `/metrics`
(api/loop_health.py), as one line for a benchmark's report: where a latency tail that
the request path does not explain came from."""

from __future__ import annotations

import math
import re

_SAMPLE = re.compile(r"^(\w+)(?:\{([^}]*)\})? ([0-9.eE+-]+|\+Inf|NaN)$")


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    found = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) == name:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
            found.append((labels, float(match.group(3))))
    return found


def _histogram(
    text: str, name: str, **wanted: str
) -> tuple[list[tuple[float, float]], float, float]:
    """Cumulative buckets (upper bound, count), the count and the sum of one series."""

    def chosen(labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in wanted.items())

    buckets: dict[float, float] = {}
    for labels, value in _samples(text, f"{name}_bucket"):
        if chosen(labels):
            bound = math.inf if labels["le"] == "+Inf" else float(labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + value
    count = sum(v for labels, v in _samples(text, f"{name}_count") if chosen(labels))
    total = sum(v for labels, v in _samples(text, f"{name}_sum") if chosen(labels))
    return sorted(buckets.items()), count, total


def _bound(buckets: list[tuple[float, float]], count: float, q: float) -> float:
    """The upper bound of the bucket that holds quantile q."""
    for bound, cumulative in buckets:
        if cumulative >= q * count:
            return bound
    return math.inf


def _ms(seconds: float) -> str:
    return "> 2.5 s" if math.isinf(seconds) else f"{seconds * 1000:g} ms"


def loop_line(text: str) -> str:
    """e.g. "event loop lag p99 <= 25 ms, max <= 100 ms; GC gen2 12 pauses, mean 31 ms"."""
    lag, lag_count, _ = _histogram(text, "modelforge_event_loop_lag_seconds")
    gc2, gc2_count, gc2_sum = _histogram(text, "modelforge_gc_pause_seconds", generation="2")
    if not lag_count:
        return "event loop lag: not reported"
    largest = next((bound for bound, n in lag if n >= lag_count), math.inf)
    line = (
        f"event loop lag p99 <= {_ms(_bound(lag, lag_count, 0.99))},"
        f" max <= {_ms(largest)} ({lag_count:.0f} wakes)"
    )
    if gc2_count:
        line += (
            f"; GC gen2 {gc2_count:.0f} pauses, mean {gc2_sum / gc2_count * 1000:.1f} ms,"
            f" max <= {_ms(next((b for b, n in gc2 if n >= gc2_count), math.inf))}"
        )
    else:
        line += "; GC gen2: no pauses"
    return line


def steady_gc_line(before: str, after: str) -> str:
    """Full collections between two scrapes (the steady window), e.g.
    "GC gen2 in the steady window: 9 pauses, mean 41 ms, 0.4 % of the time"."""
    _, count0, sum0 = _histogram(before, "modelforge_gc_pause_seconds", generation="2")
    _, count1, sum1 = _histogram(after, "modelforge_gc_pause_seconds", generation="2")
    pauses, paused_s = count1 - count0, sum1 - sum0
    if not pauses:
        return "GC gen2 in the steady window: no pauses"
    mean_ms = paused_s / pauses * 1e3
    return f"GC gen2 in the steady window: {pauses:.0f} pauses, mean {mean_ms:.0f} ms"
