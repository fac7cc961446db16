"""Prometheus metrics of the event pipeline (relay and consumers), in the worker's registry."""

from __future__ import annotations

import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram

from schemas.events import CloudEvent

_LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class PipelineMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.handled = Counter(
            "modelforge_events_handled",
            "Events a stream consumer handled (committed and acked), by consumer",
            ["consumer"],
            registry=registry,
        )
        self.terminated = Counter(
            "modelforge_events_terminated",
            "Events a consumer could not handle and gave up on (logged with their id)",
            ["consumer"],
            registry=registry,
        )
        self.lag = Histogram(
            "modelforge_event_lag_seconds",
            "From an event's time (its change) to its consumer's commit: how far the audit"
            " log and the reconciled views lag",
            ["consumer"],
            buckets=_LAG_BUCKETS,
            registry=registry,
        )

    def observe(self, consumer: str, events: Sequence[CloudEvent]) -> None:
        now = time.time()
        self.handled.labels(consumer).inc(len(events))
        lag = self.lag.labels(consumer)
        for event in events:
            lag.observe(max(0.0, now - event.time.timestamp()))
