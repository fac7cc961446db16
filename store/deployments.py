"""Deployment rules shared by the API and the workers: create, the lifecycle's transitions
(each one change and its event), what a settled deployment job means for its deployment,
the reconciler's decisions. What the gateway reads to route is store/deployment_routes.py.

Lifecycle (schemas/deployments.py): `pending` (its load job queued) → `loading` (claimed)
→ `ready` → `draining` → `unloaded`; `failed` when the load failed for good (the job's
own bounded retries with backoff ran out), `unavailable` when its node went offline or
its health failed (back to `ready` when the node reports it loaded again, or reloaded).

Every job is one of the shared leases (store/leases.py); this module only decides what
each settled job means for its deployment (`on_claimed`, `on_settled`, called by the
agent routes in the same transaction as the settle) and what the periodic reconciler
(workers/deployments.py) does where no report came (`reconcile_one`). Lock order, as
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
    LoadSpec,
    TargetSpec,
)
from schemas.errors import ErrorCode
from schemas.events import DeploymentEvent, EventType
from schemas.jobs import JobKind, JobState
from schemas.protocol import StreamName
from store import changes, leases, nodes, results, runtime
from store.deployment_tables import Deployment
from store.errors import Conflict, Missing
from store.models import Job, Node, NodeStream

ENDED = frozenset(state.value for state in ENDED_STATES)
# A runtime report must be received this long after a deployment's last transition
# before its silence about the deployment counts (a report built just before the load
# ended may arrive just after it).
REPORT_MARGIN = timedelta(seconds=2)
# Attempts of the jobs that only look or tear down.
TARGET_ATTEMPTS = 3
# Why a loaded deployment is unavailable when its own health check failed.
HEALTH_FAILED = "health_failed"


@dataclass(frozen=True)
class ReconcilePolicy:
    # How often a ready deployment's health is checked (deployment.health.v1).
    health_period_s: float = 30.0


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
    now = await nodes.now(session)
    deployment_id = uuid.uuid4()
    spec = LoadSpec(
        deployment_id=deployment_id,
        model=request.model,
        device_id=request.device_id,
        max_concurrent=request.max_concurrent,
        **run.lease_fields(),
    )
    deployment = Deployment(
        id=deployment_id,
        model=request.model,
        roles=list(request.roles),
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
    await _queue_load(session, deployment, actor=actor)
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


def load_spec_of(job: Job) -> LoadSpec:
    return LoadSpec.model_validate(job.spec)


def target_spec(job: Job) -> TargetSpec:
    return TargetSpec.model_validate(job.spec)


def spec_of(job: Job) -> LoadSpec | TargetSpec:
    if job.kind == JobKind.DEPLOYMENT_LOAD:
        return LoadSpec.model_validate(job.spec)
    return TargetSpec.model_validate(job.spec)


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


async def _queue_load(session: AsyncSession, deployment: Deployment, *, actor: str) -> Job:
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


async def _queue_target(
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


async def _current_job(
    session: AsyncSession, deployment: Deployment, *, lock: bool = False
) -> Job | None:
    if deployment.job_id is None:
        return None
    return await session.get(Job, deployment.job_id, with_for_update=lock, populate_existing=lock)


def _active(job: Job | None) -> bool:
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
    current = await _current_job(session, probe, lock=True)
    deployment = await get(session, deployment_id, lock=True)
    if deployment.state in ENDED:
        raise Conflict(
            f"the deployment already ended ({deployment.state})",
            code=ErrorCode.STATE_CONFLICT,
            extra={"state": deployment.state},
        )
    now = await nodes.now(session)
    if _active(current) and current is not None:
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
    await _queue_target(session, deployment, kind, actor=actor, deadline_s=deadline_s)
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
            transition(
                session, deployment, DeploymentState.READY, now, reason="loaded", actor=actor
            )
        elif job.state == JobState.QUEUED.value and state == DeploymentState.LOADING:
            _failure(deployment, job)
            transition(
                session, deployment, DeploymentState.PENDING, now, reason="retry", actor=actor
            )
        elif job.state == JobState.FAILED.value and state not in ENDED_STATES | {
            DeploymentState.DRAINING
        }:
            _failure(deployment, job)
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


def _failure(deployment: Deployment, job: Job) -> None:
    deployment.failure_code = job.failure_code
    deployment.failure_detail = job.failure_detail


# ------------------------------------------------------------------ the reconciler


@dataclass(frozen=True)
class NodeView:
    """What the reconciler knows of a deployment's node."""

    online: bool
    schedulable: bool
    # The last applied runtime report: when the control plane received it, and the
    # deployments it lists as loaded.
    report_received_at: datetime | None
    loaded: frozenset[uuid.UUID]


async def due(session: AsyncSession, *, limit: int, after: uuid.UUID | None) -> list[uuid.UUID]:
    """Ids of deployments that have not ended, in id order from `after` (a sweep pages)."""
    query = select(Deployment.id).where(Deployment.state.not_in(list(ENDED)))
    if after is not None:
        query = query.where(Deployment.id > after)
    rows = await session.execute(query.order_by(Deployment.id).limit(limit))
    return list(rows.scalars().all())


async def _node_view(session: AsyncSession, node: Node) -> NodeView:
    stream = (
        await session.execute(
            select(NodeStream).where(
                NodeStream.node_id == node.id, NodeStream.stream == StreamName.RUNTIME
            )
        )
    ).scalar_one_or_none()
    loaded: set[uuid.UUID] = set()
    if stream is not None and stream.good_payload:
        for entry in stream.good_payload.get("deployments", []):
            loaded.add(uuid.UUID(str(entry["deployment_id"])))
    return NodeView(
        online=node.liveness == "online" and node.enabled and not nodes.is_terminal(node),
        schedulable=node.enabled and not nodes.is_terminal(node),
        report_received_at=stream.good_received_at if stream is not None else None,
        loaded=frozenset(loaded),
    )


async def _check_health_if_due(
    session: AsyncSession,
    deployment: Deployment,
    current: Job | None,
    now: datetime,
    policy: ReconcilePolicy,
    actor: str,
) -> str | None:
    """Queue its periodic deployment.health.v1 when due and no job of it runs."""
    due = deployment.health_due_at is not None and deployment.health_due_at <= now
    if not due or _active(current):
        return None
    await _queue_target(session, deployment, JobKind.DEPLOYMENT_HEALTH, actor=actor)
    deployment.health_due_at = now + timedelta(seconds=policy.health_period_s)
    return "health queued"


async def reconcile_one(
    session: AsyncSession,
    deployment_id: uuid.UUID,
    policy: ReconcilePolicy,
    *,
    hold: bool,
    actor: str,
) -> str | None:
    """Compare what is desired with what the node reports, and move the deployment one
    step (a transition, a job, or both); what it did, or None. `hold`: the partition
    breaker holds (store/fleet.py): nothing is reloaded or failed, since nodes that look
    silent are more likely cut off than gone; routing still stops (unavailable)."""
    probe = await session.get(Deployment, deployment_id)
    if probe is None:
        return None
    # The node first, then the deployment: the order the agent routes lock in.
    node = await nodes.lock(session, probe.node_id)
    deployment = (
        await session.execute(
            select(Deployment)
            .where(Deployment.id == deployment_id)
            .with_for_update(skip_locked=True)
            .execution_options(populate_existing=True)
        )
    ).scalar_one_or_none()
    if deployment is None or node is None or deployment.state in ENDED:
        return None
    view = await _node_view(session, node)
    now = await nodes.now(session)
    state = DeploymentState(deployment.state)
    current = await _current_job(session, deployment)
    received = view.report_received_at
    # A report since the last transition: it says what the node has now. Its silence
    # about the deployment counts only past the margin.
    reported = received is not None and received > deployment.state_changed_at
    silent_for_sure = (
        received is not None and received > deployment.state_changed_at + REPORT_MARGIN
    )
    is_loaded = deployment.id in view.loaded

    if state == DeploymentState.DRAINING:
        if not view.schedulable:
            transition(
                session, deployment, DeploymentState.UNLOADED, now, reason="node_gone", actor=actor
            )
            return "unloaded"
        if not _active(current):
            await _queue_target(
                session, deployment, JobKind.DEPLOYMENT_UNLOAD, actor=actor, deadline_s=0.0
            )
            return "unload queued"
        return None

    if not view.online:
        if state in (DeploymentState.READY, DeploymentState.LOADING, DeploymentState.PENDING):
            deployment.failure_code = "node_offline"
            deployment.failure_detail = (
                f"its node is {node.liveness if node.enabled else 'disabled'}"
            )
            transition(
                session,
                deployment,
                DeploymentState.UNAVAILABLE,
                now,
                reason="node_offline",
                actor=actor,
            )
            return "unavailable"
        return None

    if state == DeploymentState.UNAVAILABLE:
        if deployment.failure_code == HEALTH_FAILED and is_loaded:
            # Loaded but failing its checks: being reported loaded says nothing new, only
            # a check that passes makes it ready again (on_settled); else it would flap.
            return await _check_health_if_due(session, deployment, current, now, policy, actor)
        if is_loaded and reported:
            deployment.failure_code = deployment.failure_detail = None
            deployment.health_due_at = now + timedelta(seconds=policy.health_period_s)
            transition(
                session,
                deployment,
                DeploymentState.READY,
                now,
                reason="reported_loaded",
                actor=actor,
            )
            return "ready"
        if reported and not hold and not _active(current):
            await _queue_load(session, deployment, actor=actor)
            transition(
                session, deployment, DeploymentState.PENDING, now, reason="reload", actor=actor
            )
            return "reload queued"
        return None

    if state == DeploymentState.READY:
        if silent_for_sure and not is_loaded and not _active(current):
            # The runtime worker no longer has it (it restarted): load it again.
            await _queue_load(session, deployment, actor=actor)
            transition(
                session, deployment, DeploymentState.PENDING, now, reason="lost", actor=actor
            )
            return "reload queued"
        return await _check_health_if_due(session, deployment, current, now, policy, actor)

    # pending / loading: the load job moves it; one that ended without a report here
    # (its lease expired on the last attempt) settles it now.
    if current is None or current.state == JobState.CANCELLED.value:
        if not hold:
            await _queue_load(session, deployment, actor=actor)
            return "load queued"
        return None
    if current.state == JobState.FAILED.value and not hold:
        _failure(deployment, current)
        transition(
            session,
            deployment,
            DeploymentState.FAILED,
            now,
            reason=current.failure_code or "failed",
            actor=actor,
        )
        return "failed"
    if current.state == JobState.SUCCEEDED.value and current.kind == JobKind.DEPLOYMENT_LOAD:
        deployment.health_due_at = now + timedelta(seconds=policy.health_period_s)
        transition(session, deployment, DeploymentState.READY, now, reason="loaded", actor=actor)
        return "ready"
    return None


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
