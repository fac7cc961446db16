"""Deployment rules shared by the API and the workers: create, the lifecycle's transitions
(each one change and its event), what a settled deployment job means for its deployment.
The reconciler's decisions are store/deployments/reconcile.py; what the gateway reads to
route is store/deployments/routing.py.

Lifecycle (schemas/deployments.py): `pending` (its load job queued) → `loading` (claimed)
→ `ready` → `draining` → `unloaded`; `failed` when the load failed for good (the job's
own bounded retries with backoff ran out), `unavailable` when its node went offline, its
runtime worker's channel is gone (store/deployments/runtime_channels.py) or its health failed (back
to `ready` when the node reports it loaded again, or reloaded).

Every job is one of the shared leases (store/leases.py); this module only decides what
each settled job means for its deployment (`on_claimed`, `on_settled`, called by the
agent routes in the same transaction as the settle) and what the periodic reconciler
(workers/deployments.py) does where no report came (store/deployments/reconcile.py). Lock order, as
every transaction here, the agent routes and a decommission take it (store/locks.py):
the node, then the job, then the deployment.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.deployments import (
    ENDED_STATES,
    KINDS,
    DeploymentCreate,
    DeploymentState,
    HealthResult,
    LoadResult,
    LoadSpec,
    TargetSpec,
)
from schemas.errors import ErrorCode
from schemas.events import DeploymentEvent, EventType
from schemas.jobs import JobKind, JobState
from store import changes, leases, nodes, results, runtime
from store.deployments.tables import Deployment
from store.errors import Conflict, Missing
from store.models import Job

ENDED = frozenset(state.value for state in ENDED_STATES)
# Attempts of the jobs that only look or tear down.
TARGET_ATTEMPTS = 3
# Why a loaded deployment is unavailable when its own health check failed.
HEALTH_FAILED = "health_failed"
# Why one is unavailable when its runtime worker's channel is gone (its node online).
RUNTIME_GONE = "runtime_gone"


@dataclass(frozen=True)
class ReconcilePolicy:
    # How often a ready deployment's health is checked (deployment.health.v1).
    health_period_s: float = 30.0
    # A runtime channel's lapse counts only while an API could hold it (as for liveness,
    # store/liveness.py: the workers pass their own LivenessThresholds' values): an API
    # present within this gap, and a lapse before the last API outage's end counted
    # from that end plus this grace (runtime workers finding an API again).
    presence_gap_s: float = 5.0
    restart_grace_s: float = 30.0


# ------------------------------------------------------------------ create and views


async def create(session: AsyncSession, request: DeploymentCreate, *, actor: str) -> Deployment:
    """A pending deployment and its load job, for a device the node's runtime worker
    reports, with the artifact resolved to the node's verified copy and the profile
    admitted (422 otherwise, as for a probe)."""
    node = await nodes.schedulable(session, request.node_id, locked=True)
    runtime.require_device(await runtime.reported_devices(session, node.id), request.device_id)
    run = await runtime.resolve_run(
        session, node.id, request.artifact, request.profile_id, request.environment_id
    )
    runtime.require_serves(run.profile, run.settings, request.endpoints)
    now = await nodes.now(session)
    deployment_id = uuid.uuid4()
    spec = LoadSpec(
        deployment_id=deployment_id,
        model=request.model,
        device_id=request.device_id,
        max_concurrent=request.max_concurrent,
        endpoints=request.endpoints,
        **run.lease_fields(),
    )
    deployment = Deployment(
        id=deployment_id,
        model=request.model,
        roles=list(request.roles),
        endpoints=list(request.endpoints),
        capabilities=None,
        node_id=node.id,
        device_id=request.device_id,
        artifact=request.artifact.model_dump(mode="json"),
        profile_id=run.profile.id,
        profile_version=run.profile.version,
        environment_id=run.environment.id,
        spec=spec.model_dump(mode="json"),
        state=DeploymentState.PENDING.value,
        max_concurrent=request.max_concurrent,
        max_attempts=request.max_attempts,
        created_at=now,
        updated_at=now,
        state_changed_at=now,
    )
    session.add(deployment)
    changes.record(session, EventType.DEPLOYMENT_CREATED, _event(deployment), actor=actor)
    await session.flush()
    await queue_load(session, deployment, actor=actor)
    return deployment


async def get(session: AsyncSession, deployment_id: uuid.UUID, *, lock: bool = False) -> Deployment:
    deployment = await session.get(
        Deployment, deployment_id, with_for_update=lock, populate_existing=lock
    )
    if deployment is None:
        raise Missing(f"no deployment {deployment_id}", code=ErrorCode.NOT_FOUND)
    return deployment


async def listed(
    session: AsyncSession,
    *,
    node_id: uuid.UUID | None,
    states: list[DeploymentState],
    model: str | None,
    limit: int,
    offset: int,
) -> list[Deployment]:
    query = select(Deployment)
    if node_id is not None:
        query = query.where(Deployment.node_id == node_id)
    if states:
        query = query.where(Deployment.state.in_([s.value for s in states]))
    if model is not None:
        query = query.where(Deployment.model == model)
    query = query.order_by(Deployment.created_at.desc(), Deployment.id).limit(limit).offset(offset)
    return list((await session.execute(query)).scalars().all())


async def jobs_of(session: AsyncSession, deployment_id: uuid.UUID) -> list[Job]:
    query = (
        select(Job)
        .where(Job.kind.in_([k.value for k in KINDS]))
        .where(Job.spec["deployment_id"].astext == str(deployment_id))
        .order_by(Job.created_at.desc())
    )
    return list((await session.execute(query)).scalars().all())


def load_spec(deployment: Deployment) -> LoadSpec:
    return LoadSpec.model_validate(deployment.spec)


# ------------------------------------------------------------------ transitions


def _event(deployment: Deployment, previous: str | None = None, reason: str | None = None) -> Any:
    return DeploymentEvent(
        deployment_id=deployment.id,
        node_id=deployment.node_id,
        model=deployment.model,
        state=deployment.state,
        previous=previous,
        reason=reason,
    )


def transition(
    session: AsyncSession,
    deployment: Deployment,
    state: DeploymentState,
    now: datetime,
    *,
    reason: str,
    actor: str,
) -> None:
    """One lifecycle step: the row and its event, in the caller's transaction."""
    previous = deployment.state
    if previous == state.value:
        return
    deployment.state = state.value
    deployment.state_changed_at = now
    deployment.updated_at = now
    changes.record(
        session,
        EventType.DEPLOYMENT_STATE_CHANGED,
        _event(deployment, previous, reason),
        actor=actor,
    )


async def queue_load(session: AsyncSession, deployment: Deployment, *, actor: str) -> Job:
    job = await leases.queue(
        session,
        JobKind.DEPLOYMENT_LOAD,
        deployment.node_id,
        load_spec(deployment),
        deployment.max_attempts,
        actor=actor,
    )
    await session.flush()  # the job's row before the reference to it
    deployment.job_id = job.id
    return job


async def queue_target(
    session: AsyncSession,
    deployment: Deployment,
    kind: JobKind,
    *,
    actor: str,
    deadline_s: float = 0.0,
) -> Job:
    spec = TargetSpec(
        deployment_id=deployment.id, device_id=deployment.device_id, deadline_s=deadline_s
    )
    job = await leases.queue(session, kind, deployment.node_id, spec, TARGET_ATTEMPTS, actor=actor)
    await session.flush()
    deployment.job_id = job.id
    return job


async def current_job(
    session: AsyncSession, deployment: Deployment, *, lock: bool = False
) -> Job | None:
    if deployment.job_id is None:
        return None
    return await session.get(Job, deployment.job_id, with_for_update=lock, populate_existing=lock)


def active(job: Job | None) -> bool:
    return job is not None and job.state not in leases.FINISHED


# ------------------------------------------------------------------ operators


async def drain(
    session: AsyncSession, deployment_id: uuid.UUID, deadline_s: float, *, actor: str
) -> Deployment:
    """No new invokes from now on (the gateway routes only `ready` ones); the drain job
    lets those in flight finish up to the deadline, then unloads. A deadline of 0 (the
    unload route) cuts them at once. 409 for a deployment that already ended."""
    # In the lock order (store/locks.py): the node, then the job, then the deployment.
    # The deployment first deadlocked with a decommission of its node, which holds the
    # node and its jobs when it comes to lock the node's deployments.
    probe = await get(session, deployment_id)
    node = await nodes.lock(session, probe.node_id)
    # Read again under the node's lock, which every change of its job holds: the job
    # it names now is the one to lock.
    await session.refresh(probe)
    current = await current_job(session, probe, lock=True)
    deployment = await get(session, deployment_id, lock=True)
    if deployment.state in ENDED:
        raise Conflict(
            f"the deployment already ended ({deployment.state})",
            code=ErrorCode.STATE_CONFLICT,
            extra={"state": deployment.state},
        )
    now = await nodes.now(session)
    if active(current) and current is not None:
        tearing_down = current.kind in (JobKind.DEPLOYMENT_DRAIN, JobKind.DEPLOYMENT_UNLOAD)
        if tearing_down and deadline_s >= (deployment.drain_deadline_s or 0):
            return deployment  # already draining at least as fast
        leases.request_cancel(session, current, now, actor=actor)
    deployment.drain_deadline_s = deadline_s
    transition(session, deployment, DeploymentState.DRAINING, now, reason="operator", actor=actor)
    if node is None or nodes.is_terminal(node) or not node.enabled:
        # Nothing there to unload through the protocol (its credential is refused).
        transition(
            session, deployment, DeploymentState.UNLOADED, now, reason="node_gone", actor=actor
        )
        return deployment
    kind = JobKind.DEPLOYMENT_DRAIN if deadline_s > 0 else JobKind.DEPLOYMENT_UNLOAD
    await queue_target(session, deployment, kind, actor=actor, deadline_s=deadline_s)
    return deployment


async def cool_down(
    session: AsyncSession, deployment_id: uuid.UUID, seconds: float, reason: str
) -> None:
    """The gateway saw it fail or time out an invoke: no routing to it for a while
    (shown in the admin API). Not a lifecycle step: no event, metrics count these."""
    await session.execute(
        update(Deployment)
        .where(Deployment.id == deployment_id)
        .values(
            cooldown_until=func.statement_timestamp() + timedelta(seconds=seconds),
            cooldown_reason=reason[:200],
        )
    )


# ------------------------------------------------------------------ the jobs' outcomes


async def _of_job(session: AsyncSession, job: Job) -> Deployment | None:
    """The deployment a deployment job works for, locked; None if the job is no longer
    the one that moves it (a newer job replaced it)."""
    raw = (job.spec or {}).get("deployment_id")
    if raw is None:
        return None
    deployment = await session.get(
        Deployment, uuid.UUID(str(raw)), with_for_update=True, populate_existing=True
    )
    if deployment is None or deployment.job_id != job.id:
        return None
    return deployment


async def on_claimed(session: AsyncSession, job: Job, now: datetime, *, actor: str) -> None:
    if job.kind != JobKind.DEPLOYMENT_LOAD:
        return
    deployment = await _of_job(session, job)
    if deployment is not None and deployment.state == DeploymentState.PENDING.value:
        transition(session, deployment, DeploymentState.LOADING, now, reason="claimed", actor=actor)


async def on_settled(
    session: AsyncSession, job: Job, now: datetime, *, actor: str, policy: ReconcilePolicy
) -> None:
    """What the job's outcome (completed, failed for good, or back in the queue for a
    retry) means for its deployment; called in the transaction that settled it."""
    deployment = await _of_job(session, job)
    if deployment is None:
        return
    state = DeploymentState(deployment.state)
    kind = JobKind(job.kind)
    if kind == JobKind.DEPLOYMENT_LOAD:
        if job.state == JobState.SUCCEEDED.value and state in (
            DeploymentState.LOADING,
            DeploymentState.PENDING,
            DeploymentState.UNAVAILABLE,
        ):
            deployment.failure_code = deployment.failure_detail = None
            deployment.health_due_at = now + timedelta(seconds=policy.health_period_s)
            loaded = results.read(job, LoadResult)
            if loaded is not None:
                caps = loaded.capabilities
                deployment.capabilities = caps.model_dump(mode="json") if caps else None
            transition(
                session, deployment, DeploymentState.READY, now, reason="loaded", actor=actor
            )
        elif job.state == JobState.QUEUED.value and state == DeploymentState.LOADING:
            record_failure(deployment, job)
            transition(
                session, deployment, DeploymentState.PENDING, now, reason="retry", actor=actor
            )
        elif job.state == JobState.FAILED.value and state not in ENDED_STATES | {
            DeploymentState.DRAINING
        }:
            record_failure(deployment, job)
            transition(
                session,
                deployment,
                DeploymentState.FAILED,
                now,
                reason=job.failure_code or "failed",
                actor=actor,
            )
        return
    if kind == JobKind.DEPLOYMENT_HEALTH:
        if job.state != JobState.SUCCEEDED.value:
            return  # a health check that did not run says nothing; the next one will
        result = results.read(job, HealthResult)
        healthy = result is not None and result.health.inference_ok
        if healthy and state == DeploymentState.UNAVAILABLE:
            deployment.failure_code = deployment.failure_detail = None
            transition(
                session, deployment, DeploymentState.READY, now, reason="healthy", actor=actor
            )
        elif not healthy and state == DeploymentState.READY:
            deployment.failure_code = HEALTH_FAILED
            deployment.failure_detail = "its health check failed"
            transition(
                session,
                deployment,
                DeploymentState.UNAVAILABLE,
                now,
                reason="health_failed",
                actor=actor,
            )
        return
    # Drain and unload: done is done; a failure for good leaves it draining, and the
    # reconciler asks again.
    if job.state == JobState.SUCCEEDED.value and state == DeploymentState.DRAINING:
        transition(
            session, deployment, DeploymentState.UNLOADED, now, reason="unloaded", actor=actor
        )


def record_failure(deployment: Deployment, job: Job) -> None:
    deployment.failure_code = job.failure_code
    deployment.failure_detail = job.failure_detail


# ------------------------------------------------------------------ runtime reports


async def record_reported(
    session: AsyncSession, node_id: uuid.UUID, payload: dict[str, Any]
) -> None:
    """An applied runtime report's invokes in flight, per deployment: what the gateway's
    power-of-two choice reads."""
    depths = {
        str(entry["deployment_id"]): int(entry.get("in_flight", 0))
        for entry in payload.get("deployments", [])
    }
    if not depths:
        await session.execute(
            update(Deployment)
            .where(Deployment.node_id == node_id, Deployment.queue_depth.is_not(None))
            .values(queue_depth=None)
        )
        return
    for deployment_id, depth in depths.items():
        await session.execute(
            update(Deployment)
            .where(Deployment.id == uuid.UUID(deployment_id), Deployment.node_id == node_id)
            .values(queue_depth=depth)
        )
