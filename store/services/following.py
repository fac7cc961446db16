"""A started replica followed one step at a time after what its artifact job and its
deployment say (the reconciler, store/services/reconcile.py, calls `follow` for every
live replica): acquiring → loading → ready, and out of it (unavailable, reloading,
drained, failed, or ended when its node is gone). The steps themselves, each writing
the row and its event, are store/services/replicas.py's.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from sqlalchemy.ext.asyncio import AsyncSession

from schemas.deployments import DeploymentState
from schemas.jobs import JobState
from schemas.services import ReplicaFailure, ReplicaPhase, RolloutState
from store import leases
from store.deployments import rules as deployments
from store.deployments.tables import Deployment
from store.errors import StoreError
from store.models import Job, Node
from store.services import replicas
from store.services.replicas import NODE_LOST, ServicePolicy
from store.services.tables import Service, ServiceReplica


async def node_lost(session: AsyncSession, node_id: uuid.UUID) -> bool:
    """Whether the node can no longer run anything: decommissioned or disabled."""
    node = await session.get(Node, node_id)
    return node is None or node.decommissioned_at is not None or not node.enabled


@dataclass(frozen=True)
class Seen:
    """What a replica's job and deployment say now."""

    job: Job | None
    deployment: Deployment | None


async def seen(session: AsyncSession, replica: ServiceReplica) -> Seen:
    job = await session.get(Job, replica.artifact_job_id) if replica.artifact_job_id else None
    deployment = (
        await session.get(Deployment, replica.deployment_id) if replica.deployment_id else None
    )
    return Seen(job, deployment)


_NOT_CLAIMED: Final = ReplicaFailure(
    code="not_claimed", detail="the node took no job for the replica within the claim timeout"
)


def _unclaimed(job: Job | None, now: datetime, policy: ServicePolicy) -> bool:
    """A job queued and never claimed (its first attempt not started) past the timeout."""
    return (
        job is not None
        and job.state == leases.QUEUED
        and job.attempt == 0
        and now - job.created_at > timedelta(seconds=policy.claim_timeout_s)
    )


def _deployment_failure(deployment: Deployment, fallback: str) -> ReplicaFailure:
    return ReplicaFailure(
        code=(deployment.failure_code or fallback)[:64], detail=deployment.failure_detail or ""
    )


async def follow(
    session: AsyncSession,
    service: Service,
    replica: ServiceReplica,
    now: datetime,
    policy: ServicePolicy,
    *,
    actor: str,
) -> str | None:
    """Move the replica one step after its job and deployment; what it did, or None."""
    phase = ReplicaPhase(replica.phase)
    state = await seen(session, replica)
    if phase == ReplicaPhase.ACQUIRING:
        job = state.job
        if job is None or job.state in (leases.QUEUED, leases.LEASED):
            if _unclaimed(job, now, policy):
                await replicas.cancel_acquisition(session, replica, now, actor=actor)
                replicas.fail(session, service, replica, now, policy, _NOT_CLAIMED, actor=actor)
                return "acquisition not claimed"
            return None
        if job.state != JobState.SUCCEEDED.value:
            if await node_lost(session, replica.node_id):
                # Cancelled (or failed) because its node was decommissioned or disabled:
                # not the template's fault, so no backoff and no failed new replica
                # (which would stop a rollout); a replacement is placed elsewhere.
                replicas.end(session, service, replica, now, reason=NODE_LOST, actor=actor)
                return "ended (node lost)"
            failure = ReplicaFailure(
                code=job.failure_code or job.state, detail=job.failure_detail or ""
            )
            replicas.fail(session, service, replica, now, policy, failure, actor=actor)
            return "acquisition failed"
        template = replicas.template_of(service, replica.generation)
        if template is None or (
            replica.generation != service.generation
            and service.rollout_state != RolloutState.STOPPED.value
        ):
            # A newer template came while it acquired: what it would load is outdated.
            await replicas.cancel_acquisition(session, replica, now, actor=actor)
            replicas.end(session, service, replica, now, reason="outdated", actor=actor)
            return "ended"
        refused = await replicas.load(session, service, replica, template, actor=actor)
        if refused is not None:
            if await node_lost(session, replica.node_id):
                # Disabled or decommissioned since the file arrived: not the template's.
                replicas.end(session, service, replica, now, reason=NODE_LOST, actor=actor)
                return "ended (node lost)"
            replicas.fail(session, service, replica, now, policy, refused, actor=actor)
            return "load refused"
        replicas.move(
            session, service, replica, ReplicaPhase.LOADING, now, reason="acquired", actor=actor
        )
        return "loading"
    deployment = state.deployment
    if deployment is None:
        return None
    dstate = DeploymentState(deployment.state)
    if phase == ReplicaPhase.DRAINING:
        if dstate in (DeploymentState.UNLOADED, DeploymentState.FAILED):
            replicas.end(
                session,
                service,
                replica,
                now,
                reason=replica.ended_reason or "drained",
                actor=actor,
            )
            return "ended"
        return None
    if dstate == DeploymentState.FAILED:
        replicas.fail(
            session,
            service,
            replica,
            now,
            policy,
            _deployment_failure(deployment, "failed"),
            actor=actor,
        )
        return "load failed"
    if dstate in (DeploymentState.UNLOADED, DeploymentState.DRAINING):
        # An operator drained or unloaded the deployment itself.
        if dstate == DeploymentState.UNLOADED:
            replicas.end(session, service, replica, now, reason="unloaded", actor=actor)
            return "ended"
        replica.ended_reason = "drained"
        replicas.move(
            session, service, replica, ReplicaPhase.DRAINING, now, reason="operator", actor=actor
        )
        return "draining"
    if dstate == DeploymentState.READY and phase != ReplicaPhase.READY:
        replica.failure_code = replica.failure_detail = None
        replicas.forgive(service, replica.node_id)
        replicas.move(
            session,
            service,
            replica,
            ReplicaPhase.READY,
            now,
            reason="deployment_ready",
            actor=actor,
        )
        return "ready"
    if dstate == DeploymentState.UNAVAILABLE and phase != ReplicaPhase.UNAVAILABLE:
        failure = _deployment_failure(deployment, "unavailable")
        replica.failure_code, replica.failure_detail = failure.code, failure.detail or None
        replicas.move(
            session,
            service,
            replica,
            ReplicaPhase.UNAVAILABLE,
            now,
            reason=failure.code,
            actor=actor,
        )
        return "unavailable"
    if dstate == DeploymentState.PENDING and phase == ReplicaPhase.LOADING:
        if _unclaimed(await deployments.current_job(session, deployment), now, policy):
            # Its node is online but nothing there takes the load (its runtime worker
            # is gone while its agent beats): unload it whenever it can, go elsewhere.
            with contextlib.suppress(StoreError):
                async with session.begin_nested():
                    await deployments.drain(session, deployment.id, 0.0, actor=actor)
            replicas.fail(session, service, replica, now, policy, _NOT_CLAIMED, actor=actor)
            return "load not claimed"
        return None
    if dstate in (DeploymentState.PENDING, DeploymentState.LOADING) and phase == ReplicaPhase.READY:
        # Reloading (its runtime worker lost it): not serving until it is ready again.
        replicas.move(
            session, service, replica, ReplicaPhase.LOADING, now, reason="reloading", actor=actor
        )
        return "loading"
    return None
