"""The actors, declared on an explicit broker (no global broker, no import-time binding)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import dramatiq

from broker.jetstream import AsyncResource
from store.correlation import correlation_id_var
from store.deployments.rules import ReconcilePolicy
from store.fleet import PartitionBreaker
from store.leases import LeasePolicy
from store.liveness import LivenessThresholds
from store.liveness_sweep import sweep
from store.rollup.retention import Retention
from store.services.replicas import ServicePolicy
from store.services.snapshot import FleetCache
from workers.database import Database
from workers.deployments import reconcile
from workers.leases import expire
from workers.outbox_retention import prune_outbox
from workers.rollup import rollup_minute, rollup_prune
from workers.service_reconcile import reconcile as reconcile_services

logger = logging.getLogger("modelforge.workers")

LIVENESS_QUEUE = "liveness"
LEASES_QUEUE = "leases"
DEPLOYMENTS_QUEUE = "deployments"
SERVICES_QUEUE = "services"
MAINTENANCE_QUEUE = "maintenance"
# Its own queue: a long prune on the maintenance queue never delays a minute's row.
ROLLUP_QUEUE = "rollup"


@dataclass(frozen=True)
class Actors:
    liveness_sweep: dramatiq.Actor[Any, Any]
    lease_expiry: dramatiq.Actor[Any, Any]
    deployment_reconcile: dramatiq.Actor[Any, Any]
    outbox_prune: dramatiq.Actor[Any, Any]
    service_reconcile: dramatiq.Actor[Any, Any]
    rollup_minute: dramatiq.Actor[Any, Any]
    rollup_prune: dramatiq.Actor[Any, Any]


def _period(name: str, bucket: object) -> int:
    if not isinstance(bucket, int) or isinstance(bucket, bool):
        # Only the ticker sends these; anything else is a malformed message and belongs
        # in the dead-letter stream, not in a silent no-op.
        raise TypeError(f"{name} expects the period number, got {bucket!r}")
    # Audit rows and events of this run carry the message that caused them.
    correlation_id_var.set(f"{name}-{bucket}")
    return bucket


def _periodic(
    broker: dramatiq.Broker,
    name: str,
    queue: str,
    work: Callable[[], Awaitable[object]],
    *,
    time_limit_ms: int = 60_000,
) -> dramatiq.Actor[Any, Any]:
    """An actor the ticker sends once a period (workers/main.py). Each is idempotent,
    decided from stored state; a run that fails is not retried, as the next period's
    run does the same work anyway."""

    async def run(bucket: int) -> None:
        _period(name, bucket)
        await work()

    run.__name__ = run.__qualname__ = name
    declare = dramatiq.actor(
        broker=broker,
        actor_name=name,
        queue_name=queue,
        max_retries=0,
        time_limit=time_limit_ms,
    )
    return declare(run)


def declare_actors(
    broker: dramatiq.Broker,
    database: AsyncResource[Database],
    thresholds: LivenessThresholds,
    breaker: PartitionBreaker,
    leases: LeasePolicy,
    deployments: ReconcilePolicy,
    outbox_retention_s: float,
    services: ServicePolicy,
    rollup_retention: Retention,
) -> Actors:
    async def liveness() -> None:
        """Record every due liveness transition."""
        transitions = await sweep(database.get().sessions, thresholds, breaker=breaker)
        for t in transitions:
            logger.info("node %s: %s -> %s", t.node_id, t.previous, t.current)

    async def lease_expiry() -> None:
        """Take back every expired job lease."""
        await expire(database.get().sessions, leases)

    # A runtime channel's lapse counts only while an API could hold it, on the same
    # presence rules as liveness (store/deployments/runtime_channels.py: gone).
    reconcile_policy = replace(
        deployments,
        presence_gap_s=thresholds.presence_gap_s,
        restart_grace_s=thresholds.restart_grace_s,
    )

    async def deployment_reconcile() -> None:
        """Move every deployment one step towards what is desired (from the runtime
        workers' reports and channels, the jobs, node liveness)."""
        await reconcile(database.get().sessions, reconcile_policy)

    # The fleet snapshot placement decides from, kept across sweeps by this process.
    fleet = FleetCache()

    async def service_reconcile() -> None:
        """Move every service one step: follow its replicas, place, heal, scale, roll
        out, delete (store/services/reconcile.py)."""
        await reconcile_services(database.get().sessions, services, fleet)

    async def outbox_prune() -> None:
        """Delete the published events past the retention period."""
        await prune_outbox(database.get().sessions, outbox_retention_s)

    async def rollup() -> None:
        """The fleet's row of this minute and the nodes' telemetry minutes."""
        await rollup_minute(database.get().sessions)

    async def rollup_retention_prune() -> None:
        """Delete the rollup's rows past retention."""
        await rollup_prune(database.get().sessions, rollup_retention)

    return Actors(
        liveness_sweep=_periodic(broker, "liveness_sweep", LIVENESS_QUEUE, liveness),
        lease_expiry=_periodic(broker, "lease_expiry", LEASES_QUEUE, lease_expiry),
        deployment_reconcile=_periodic(
            broker, "deployment_reconcile", DEPLOYMENTS_QUEUE, deployment_reconcile
        ),
        # A prune of a long backlog deletes batch after batch: give it longer.
        outbox_prune=_periodic(
            broker, "outbox_prune", MAINTENANCE_QUEUE, outbox_prune, time_limit_ms=300_000
        ),
        service_reconcile=_periodic(broker, "service_reconcile", SERVICES_QUEUE, service_reconcile),
        rollup_minute=_periodic(broker, "rollup_minute", ROLLUP_QUEUE, rollup),
        rollup_prune=_periodic(
            broker, "rollup_prune", MAINTENANCE_QUEUE, rollup_retention_prune, time_limit_ms=300_000
        ),
    )
