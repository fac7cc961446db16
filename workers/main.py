"""`modelforge worker`: dramatiq workers on JetStream, as many processes as asked.

One process: build the broker (ordered middleware in broker/jetstream/factory.py) and
declare the actors, waiting for JetStream while it cannot answer (workers/startup.py),
open the shared database on the actors' loop, start the event pipeline
(relay, audit and reconcile consumers), the periodic ticker and the metrics endpoint,
then run until SIGTERM/SIGINT and drain:
in-flight actors finish and are acked, prefetched messages go back to the stream.

Several processes: a supervisor starts that many children and restarts one that dies,
like dramatiq's own CLI; every child shares the same durable consumers.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import dataclass
from functools import partial

import dramatiq
from prometheus_client import CollectorRegistry, start_http_server

from agent.supervisor import (
    ChildProcess,
    RestartPolicy,
    Supervisor,
    run_children,
    stop_event,
)
from broker.jetstream import AsyncResource, BrokerSettings, JetStreamBroker, build_broker
from store.fleet import PartitionBreaker
from store.liveness import LivenessThresholds, presence_gap
from workers.actors import Actors, declare_actors
from workers.database import Database, database_resource
from workers.fleet_metrics import FleetGauges, FleetMetricsMiddleware
from workers.metrics import PipelineMetrics
from workers.pipeline import PipelineSettings
from workers.services import PipelineMiddleware
from workers.settings import WorkerSettings
from workers.startup import wait_for_jetstream
from workers.ticker import Periodic, PeriodicTicker

logger = logging.getLogger("modelforge.workers")

PROCESS_INDEX_ENV = "MODELFORGE_WORKER_PROCESS_INDEX"


@dataclass(frozen=True)
class _Started:
    broker: JetStreamBroker
    registry: CollectorRegistry
    actors: Actors


def _start(
    settings: WorkerSettings, broker_settings: BrokerSettings, database: AsyncResource[Database]
) -> _Started:
    """Connect, declare the streams and every actor's queue: one attempt of the start.
    Its own registry each time, as the middleware registers its metrics on creation."""
    registry = CollectorRegistry()
    broker = build_broker(
        broker_settings,
        registry=registry,
        resources=[database],
        client_name=f"modelforge-worker-{os.getpid()}",
    )
    try:
        actors = _assemble(broker, settings, database, registry)
    except BaseException:
        broker.close()
        raise
    return _Started(broker, registry, actors)


def _assemble(
    broker: JetStreamBroker,
    settings: WorkerSettings,
    database: AsyncResource[Database],
    registry: CollectorRegistry,
) -> Actors:
    pipeline = PipelineSettings(
        settings.nats_url,
        relay=settings.run_relay,
        consumers=settings.run_consumers,
        relay_batch_size=settings.relay_batch_size,
        relay_poll_interval_s=settings.relay_poll_interval_s,
        consumer_batch_size=settings.consumer_batch_size,
        consumer_ack_wait_s=settings.consumer_ack_wait_s,
        stream=settings.events_stream(),
    )
    if pipeline.relay or pipeline.consumers:
        broker.add_middleware(PipelineMiddleware(database, pipeline, PipelineMetrics(registry)))
    if settings.metrics_port:
        # Fleet state for alerting (ops/alerts/): only worth reading where it is served.
        broker.add_middleware(FleetMetricsMiddleware(database, FleetGauges(registry)))
    thresholds = LivenessThresholds(
        settings.stale_after_s,
        settings.offline_after_s,
        restart_grace_s=settings.restart_grace_s,
        presence_gap_s=presence_gap(settings.presence_gap_s, settings.stale_after_s),
    )
    breaker = PartitionBreaker(settings.partition_share, settings.partition_min_nodes)
    return declare_actors(
        broker,
        database,
        thresholds,
        breaker,
        settings.lease_policy(),
        settings.reconcile_policy(),
        settings.outbox_retention_s,
        settings.service_policy(),
        settings.rollup_retention(),
    )


def run_worker_process(
    settings: WorkerSettings, broker_settings: BrokerSettings, *, threads: int, index: int = 0
) -> int:
    stop = stop_event()
    database = database_resource(settings.database_url, settings.db_pool_size)
    started = wait_for_jetstream(
        partial(_start, settings, broker_settings, database),
        stop,
        initial_s=settings.jetstream_wait_initial_s,
        max_s=settings.jetstream_wait_max_s,
    )
    if started is None:
        logger.info("worker stopped before JetStream was ready")
        return 0
    broker, registry, actors = started.broker, started.registry, started.actors
    if settings.metrics_port:
        port = settings.metrics_port + index
        start_http_server(port, addr=settings.metrics_host, registry=registry)
        logger.info("metrics on http://%s:%d/metrics", settings.metrics_host, port)
    # As dramatiq's CLI does: some middleware (TimeLimit) starts its machinery here.
    broker.emit_after("process_boot")
    worker = dramatiq.Worker(broker, worker_threads=threads)
    worker.start()
    ticker = PeriodicTicker(broker, schedule(actors, settings))
    ticker.start()
    logger.info("worker %d running (%d threads)", index, threads)
    stop.wait()
    logger.info("draining: in-flight work finishes, prefetched messages go back")
    ticker.stop()
    worker.stop(timeout=30_000)
    broker.close()
    logger.info("worker stopped")
    return 0


def schedule(actors: Actors, settings: WorkerSettings) -> list[Periodic]:
    """The periodic work of the workers, one entry per job."""
    return [
        Periodic(actors.liveness_sweep, settings.sweep_period_s),
        Periodic(actors.lease_expiry, settings.lease_sweep_period_s),
        Periodic(actors.deployment_reconcile, settings.deployment_sweep_period_s),
        Periodic(actors.outbox_prune, settings.outbox_prune_period_s),
        Periodic(actors.service_reconcile, settings.service_sweep_period_s),
        Periodic(actors.rollup_minute, settings.rollup_period_s),
        Periodic(actors.rollup_prune, settings.rollup_prune_period_s),
    ]


def supervise(processes: int, threads: int) -> int:
    """Run `processes` single-process workers; restart any that dies (with backoff);
    stop all on a signal, or when one crash-loops."""
    stop = stop_event()
    supervisor = Supervisor(RestartPolicy(), say=logger.warning)
    children: list[ChildProcess] = []
    for index in range(processes):
        argv = [sys.executable, "-m", "cli.main", "worker", "--processes", "1"]
        argv += ["--threads", str(threads)]
        env = {**os.environ, PROCESS_INDEX_ENV: str(index)}
        # Longer than a worker's drain (Worker.stop waits up to 30 s for in-flight actors).
        # Tied to this supervisor: a SIGKILLed one must not leave its workers running.
        child = ChildProcess(argv, env, stop_timeout_s=40, parent_death_signal=signal.SIGTERM)
        child.start()
        children.append(child)
        supervisor.add(f"worker {index}", child)
    return run_children(supervisor, children, stop, "worker")
