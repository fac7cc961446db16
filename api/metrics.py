"""Prometheus metrics of the API, served at `/metrics`.

One registry per app (built in create_app, reached through ApiState): no module-level
collectors, so two apps in one process (tests) never share counters.

Under `modelforge api --processes N` a scrape reaches whichever process accepts the
connection, so there `/metrics` serves every API process's metrics, summed:
prometheus_client's multiprocess mode, the documented way for pre-fork servers. The
supervisor (api/processes.py) gives its children, and only them, a private directory in
PROMETHEUS_MULTIPROC_DIR; prometheus_client then keeps each value in a file of the
process's own there (chosen at import, so the variable must be in the environment the
process starts with), and `served` collects all the files: counters and histograms are
summed over processes, and a process that died keeps its file, so a replaced process's
counts stay in the sum and no counter goes backwards. A process without that variable
(`--processes 1`, tests' in-process apps) serves its own registry, as before.

A gauge added here must say how processes combine (`multiprocess_mode=`): a `live*`
mode sums, or takes the extreme of, the running processes only (the supervisor retires
a stopped child's gauges with `mark_process_dead`); `mostrecent` for a value every
process sees alike. The default, `all`, would keep a series per pid, dead ones included.

* requests by route template, method and status, and their latency;
* heartbeats accepted, by path (routine or transactional), and group-committed ones;
* ingest decisions per stream: applied, not applied (the reason), replay;
* authentication refusals by error code;
* the gateway's requests and tokens per service client and served model.

The route label is the template (`/api/v1/admin/hardware/nodes/{node_id}`), never the
concrete path, so labels stay bounded and no identifier reaches the metrics.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.multiprocess import MultiProcessCollector

from schemas.agent import IngestResult
from schemas.errors import ErrorCode
from store.errors import Conflict

# Read by prometheus_client at import; set by api/processes.py for its children.
MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def served_registry(own: CollectorRegistry) -> CollectorRegistry:
    """What `/metrics` serves: this process's registry, or, in multiprocess mode, a
    registry that collects every process's files (never `own`, whose metrics are in
    those files already: registering both would export them twice)."""
    directory = os.environ.get(MULTIPROCESS_DIR_ENV)
    if directory is None:
        return own
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    return registry


@dataclass
class ApiMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    served: CollectorRegistry = field(init=False)

    def __post_init__(self) -> None:
        self.served = served_registry(self.registry)
        self.requests = Counter(
            "modelforge_http_requests",
            "HTTP requests answered, by route template, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "modelforge_http_request_duration_seconds",
            "Time from the request's arrival to its last response byte",
            ["route", "method"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.heartbeats = Counter(
            "modelforge_heartbeats",
            "Heartbeats accepted, by path: routine (cached, group-committed) or transactional",
            ["path"],
            registry=self.registry,
        )
        self.fast_path = Counter(
            "modelforge_fast_path",
            "Fleet requests the raw routes answered, or declined to the documented route"
            " (api/agent/fast_path.py)",
            ["route", "outcome"],
            registry=self.registry,
        )
        self.telemetry_batches = Counter(
            "modelforge_telemetry_batches",
            "Group-committed telemetry transactions (api/telemetry_batch.py)",
            registry=self.registry,
        )
        self.telemetry_batched = Counter(
            "modelforge_telemetry_batched_samples",
            "Telemetry samples written by those transactions",
            registry=self.registry,
        )
        self.return_batches = Counter(
            "modelforge_heartbeat_return_batches",
            "Group-committed transactions of returning nodes' heartbeats (api/return_batch.py)",
            registry=self.registry,
        )
        self.returns_batched = Counter(
            "modelforge_heartbeat_returns_batched",
            "Returning nodes' heartbeats those transactions recorded",
            registry=self.registry,
        )
        self.requests_shed = Counter(
            "modelforge_requests_shed",
            "Node requests refused with 429 because too many were waiting for the database"
            " (api/shedding.py), by route",
            ["route"],
            registry=self.registry,
        )
        self.requests_waiting = Gauge(
            "modelforge_node_requests_waiting",
            "Node requests in flight on the transactional path (the load shedder's count)",
            multiprocess_mode="livesum",
            registry=self.registry,
        )
        self.heartbeats_flushed = Counter(
            "modelforge_heartbeat_timestamps_flushed",
            "Routine heartbeat timestamps written by the group commit",
            registry=self.registry,
        )
        self.ingest = Counter(
            "modelforge_ingest_decisions",
            "Inventory and telemetry samples by decision (applied, the not-applied reason, replay)",
            ["stream", "decision"],
            registry=self.registry,
        )
        self.auth_failures = Counter(
            "modelforge_auth_failures",
            "Refused credentials, tokens and operator keys, by error code",
            ["code"],
            registry=self.registry,
        )
        # Invokes are metered here, not audited one by one.
        self.invokes = Counter(
            "modelforge_gateway_invokes",
            "Gateway requests by outcome (ok, the error code), whether streamed, and the "
            "endpoint (chat, completions, embeddings)",
            ["outcome", "stream", "endpoint"],
            registry=self.registry,
        )
        self.invoke_attempts = Counter(
            "modelforge_gateway_attempts",
            "Deliveries to deployments, by result (answered, unreachable, refused, timeout)",
            ["result"],
            registry=self.registry,
        )
        # Per service client and served model (api/gateway/usage.py): bounded, clients x
        # the models in their scopes. The client's name, never its id (no identifier
        # in a label): two clients of one name share a series; the admin usage route
        # tells them apart.
        self.client_requests = Counter(
            "modelforge_gateway_client_requests",
            "Gateway requests by service client, served model and outcome (ok, the error code)",
            ["client", "model", "outcome"],
            registry=self.registry,
        )
        self.client_tokens = Counter(
            "modelforge_gateway_client_tokens",
            "Tokens the nodes reported per service client and served model, by kind"
            " (prompt, completion)",
            ["client", "model", "kind"],
            registry=self.registry,
        )
        self.gateway_overhead = Histogram(
            "modelforge_gateway_overhead_seconds",
            "Gateway time from a request's arrival to its invoke's delivery to the node",
            buckets=_BUCKETS,
            registry=self.registry,
        )


def count_decision(metrics: ApiMetrics, stream: str, result: IngestResult) -> None:
    decision = "applied" if result.applied else str(result.reason or "not_applied")
    metrics.ingest.labels(stream, decision).inc()


@contextlib.contextmanager
def counted_ingest(
    metrics: ApiMetrics, stream: str
) -> Iterator[Callable[[IngestResult], IngestResult]]:
    """Count the decision of one inventory or telemetry sample, replays included."""

    def count(result: IngestResult) -> IngestResult:
        count_decision(metrics, stream, result)
        return result

    try:
        yield count
    except Conflict as exc:
        if exc.code == ErrorCode.SEQUENCE_REPLAYED:
            metrics.ingest.labels(stream, "replay").inc()
        raise
