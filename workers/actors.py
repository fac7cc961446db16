"""The actors, declared on an explicit broker (no global broker, no import-time binding)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import dramatiq

from broker.jetstream import AsyncResource
from store.correlation import correlation_id_var
from store.deployments import ReconcilePolicy
from store.fleet import PartitionBreaker
from store.leases import LeasePolicy
from store.liveness import LivenessThresholds
from workers.database import Database
from workers.deployments import reconcile
from workers.leases import expire
from workers.liveness import sweep
from workers.outbox_retention import prune_outbox

logger = logging.getLogger("modelforge.workers")

LIVENESS_QUEUE = "liveness"
LEASES_QUEUE = "leases"
DEPLOYMENTS_QUEUE = "deployments"
MAINTENANCE_QUEUE = "maintenance"


@dataclass(frozen=True)
class Actors:
    liveness_sweep: dramatiq.Actor[Any, Any]
    lease_expiry: dramatiq.Actor[Any, Any]
    deployment_reconcile: dramatiq.Actor[Any, Any]
    outbox_prune: dramatiq.Actor[Any, Any]


def _period(name: str, bucket: object) -> int:
    if not isinstance(bucket, int) or isinstance(bucket, bool):
        # Only the ticker sends these; anything else is a malformed message and belongs
        # in the dead-letter stream, not in a silent no-op.
        raise TypeError(f"{name} expects the period number, got {bucket!r}")
    # Audit rows and events of this run carry the message that caused them.
    correlation_id_var.set(f"{name}-{bucket}")
    return bucket


def declare_actors(
    broker: dramatiq.Broker,
    database: AsyncResource[Database],
    thresholds: LivenessThresholds,
    breaker: PartitionBreaker,
    leases: LeasePolicy,
    deployments: ReconcilePolicy,
    outbox_retention_s: float,
) -> Actors:
    @dramatiq.actor(
        broker=broker,
        actor_name="liveness_sweep",
        queue_name=LIVENESS_QUEUE,
        # A sweep is rescheduled every period anyway: retrying an old one is pointless.
        max_retries=0,
        time_limit=60_000,
    )
    async def liveness_sweep(bucket: int) -> None:
        """Record every due liveness transition. Idempotent: decided from stored state."""
        _period("liveness_sweep", bucket)
        transitions = await sweep(database.get().sessions, thresholds, breaker=breaker)
        for t in transitions:
            logger.info("node %s: %s -> %s", t.node_id, t.previous, t.current)

    @dramatiq.actor(
        broker=broker,
        actor_name="lease_expiry",
        queue_name=LEASES_QUEUE,
        max_retries=0,
        time_limit=60_000,
    )
    async def lease_expiry(bucket: int) -> None:
        """Take back every expired job lease. Idempotent: decided from stored state."""
        _period("lease_expiry", bucket)
        await expire(database.get().sessions, leases)

    @dramatiq.actor(
        broker=broker,
        actor_name="deployment_reconcile",
        queue_name=DEPLOYMENTS_QUEUE,
        max_retries=0,
        time_limit=60_000,
    )
    async def deployment_reconcile(bucket: int) -> None:
        """Move every deployment one step towards what is desired. Idempotent: decided
        from stored state (the runtime workers' reports, the jobs, node liveness)."""
        _period("deployment_reconcile", bucket)
        await reconcile(database.get().sessions, deployments)

    @dramatiq.actor(
        broker=broker,
        actor_name="outbox_prune",
        queue_name=MAINTENANCE_QUEUE,
        max_retries=0,
        time_limit=300_000,
    )
    async def outbox_prune(bucket: int) -> None:
        """Delete the published events past the retention period. Idempotent."""
        _period("outbox_prune", bucket)
        await prune_outbox(database.get().sessions, outbox_retention_s)

    return Actors(
        liveness_sweep=liveness_sweep,
        lease_expiry=lease_expiry,
        deployment_reconcile=deployment_reconcile,
        outbox_prune=outbox_prune,
    )
