"""The deployment reconciler's decisions (workers/deployments.py runs them): for each
deployment not ended, compare what is desired with what its node reports and move it one
step. The lifecycle, its transitions and the jobs' outcomes are store/deployments/rules.py;
the lock order is the same (store/locks.py): the node, then the job, then the
deployment.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.deployments import DeploymentState
from schemas.jobs import JobKind, JobState
from schemas.protocol import StreamName
from store import nodes
from store.deployments import rules as deployments
from store.deployments import runtime_channels
from store.deployments.tables import Deployment
from store.models import Job, Node, NodeStream

# A runtime report must be received this long after a deployment's last transition
# before its silence about the deployment counts (a report built just before the load
# ended may arrive just after it).
REPORT_MARGIN = timedelta(seconds=2)


@dataclass(frozen=True)
class NodeView:
    """What the reconciler knows of a deployment's node."""

    online: bool
    schedulable: bool
    # It held a runtime channel and that channel is gone (store/deployments/runtime_channels.py):
    # its runtime worker died, or cannot reach the control plane.
    runtime_gone: bool
    # The last applied runtime report: when the control plane received it, and the
    # deployments it lists as loaded.
    report_received_at: datetime | None
    loaded: frozenset[uuid.UUID]


async def due(session: AsyncSession, *, limit: int, after: uuid.UUID | None) -> list[uuid.UUID]:
    """Ids of deployments that have not ended, in id order from `after` (a sweep pages)."""
    query = select(Deployment.id).where(Deployment.state.not_in(list(deployments.ENDED)))
    if after is not None:
        query = query.where(Deployment.id > after)
    rows = await session.execute(query.order_by(Deployment.id).limit(limit))
    return list(rows.scalars().all())


async def _node_view(
    session: AsyncSession, node: Node, policy: deployments.ReconcilePolicy
) -> NodeView:
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
        runtime_gone=await runtime_channels.gone(
            session,
            node.id,
            presence_gap_s=policy.presence_gap_s,
            restart_grace_s=policy.restart_grace_s,
        ),
        report_received_at=stream.good_received_at if stream is not None else None,
        loaded=frozenset(loaded),
    )


async def _check_health_if_due(
    session: AsyncSession,
    deployment: Deployment,
    current: Job | None,
    now: datetime,
    policy: deployments.ReconcilePolicy,
    actor: str,
) -> str | None:
    """Queue its periodic deployment.health.v1 when due and no job of it runs."""
    due = deployment.health_due_at is not None and deployment.health_due_at <= now
    if not due or deployments.active(current):
        return None
    await deployments.queue_target(session, deployment, JobKind.DEPLOYMENT_HEALTH, actor=actor)
    deployment.health_due_at = now + timedelta(seconds=policy.health_period_s)
    return "health queued"


async def reconcile_one(
    session: AsyncSession,
    deployment_id: uuid.UUID,
    policy: deployments.ReconcilePolicy,
    *,
    hold: bool,
    actor: str,
) -> str | None:
    """Compare what is desired with what the node reports, and move the deployment one
    step (a deployments.transition, a job, or both); what it did, or None. `hold`: the partition
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
    if deployment is None or node is None or deployment.state in deployments.ENDED:
        return None
    view = await _node_view(session, node, policy)
    now = await nodes.now(session)
    state = DeploymentState(deployment.state)
    current = await deployments.current_job(session, deployment)
    received = view.report_received_at
    # A report since the last deployments.transition: it says what the node has now. Its silence
    # about the deployment counts only past the margin.
    reported = received is not None and received > deployment.state_changed_at
    silent_for_sure = (
        received is not None and received > deployment.state_changed_at + REPORT_MARGIN
    )
    is_loaded = deployment.id in view.loaded

    if state == DeploymentState.DRAINING:
        if not view.schedulable:
            deployments.transition(
                session, deployment, DeploymentState.UNLOADED, now, reason="node_gone", actor=actor
            )
            return "unloaded"
        if not deployments.active(current):
            await deployments.queue_target(
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
            deployments.transition(
                session,
                deployment,
                DeploymentState.UNAVAILABLE,
                now,
                reason="node_offline",
                actor=actor,
            )
            return "unavailable"
        return None

    if view.runtime_gone:
        # The gateway can no longer reach it: shown as it is, and nothing reloaded or
        # checked before the runtime worker is back (a report after its return decides).
        if state == DeploymentState.READY:
            deployment.failure_code = deployments.RUNTIME_GONE
            deployment.failure_detail = "its runtime worker's channel is gone"
            deployments.transition(
                session,
                deployment,
                DeploymentState.UNAVAILABLE,
                now,
                reason=deployments.RUNTIME_GONE,
                actor=actor,
            )
            return "unavailable"
        if state == DeploymentState.UNAVAILABLE:
            return None

    if state == DeploymentState.UNAVAILABLE:
        if deployment.failure_code == deployments.HEALTH_FAILED and is_loaded:
            # Loaded but failing its checks: being reported loaded says nothing new, only
            # a check that passes makes it ready again (on_settled); else it would flap.
            return await _check_health_if_due(session, deployment, current, now, policy, actor)
        if is_loaded and reported:
            deployment.failure_code = deployment.failure_detail = None
            deployment.health_due_at = now + timedelta(seconds=policy.health_period_s)
            deployments.transition(
                session,
                deployment,
                DeploymentState.READY,
                now,
                reason="reported_loaded",
                actor=actor,
            )
            return "ready"
        if reported and not hold and not deployments.active(current):
            await deployments.queue_load(session, deployment, actor=actor)
            deployments.transition(
                session, deployment, DeploymentState.PENDING, now, reason="reload", actor=actor
            )
            return "reload queued"
        return None

    if state == DeploymentState.READY:
        if silent_for_sure and not is_loaded and not deployments.active(current):
            # The runtime worker no longer has it (it restarted): load it again.
            await deployments.queue_load(session, deployment, actor=actor)
            deployments.transition(
                session, deployment, DeploymentState.PENDING, now, reason="lost", actor=actor
            )
            return "reload queued"
        return await _check_health_if_due(session, deployment, current, now, policy, actor)

    # pending / loading: the load job moves it; one that ended without a report here
    # (its lease expired on the last attempt) settles it now.
    if current is None or current.state == JobState.CANCELLED.value:
        if not hold:
            await deployments.queue_load(session, deployment, actor=actor)
            return "load queued"
        return None
    if current.state == JobState.FAILED.value and not hold:
        deployments.record_failure(deployment, current)
        deployments.transition(
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
        deployments.transition(
            session, deployment, DeploymentState.READY, now, reason="loaded", actor=actor
        )
        return "ready"
    return None
