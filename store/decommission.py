"""Permanent decommission: a terminal state that refuses the identity everywhere, forever.

`preview` says what a decommission would do now, its plan, and the plan's hash;
`execute` takes that hash and, under the node's lock, recomputes the plan and refuses
(409 decommission_plan_changed, nothing changed) when it is no longer the one the
operator looked at: a credential issued, a job created or claimed, a deployment
created or loaded in between. Otherwise it does exactly the plan: revokes the node's
credentials and its open recovery tokens, cancels its open jobs, ends its live
deployments (unloaded: the node can never be reached through the protocol again),
marks it decommissioned (every API process drops it from its node cache:
store/nodes.py standing_changed) and records the events. Admission refuses the node
from then on (store/node_credentials.py). The operator routes call these directly
(api/admin/routes.py).

The plan's hash is `plan_hash`, the one rule for it.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Select, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from schemas.admin import (
    DecommissionDeployment,
    DecommissionJob,
    DecommissionPreview,
    DecommissionRequest,
    DecommissionResult,
    Liveness,
)
from schemas.deployments import DeploymentState
from schemas.errors import ErrorCode
from schemas.events import OPERATOR_ACTOR, EventType, NodeDecommissioned
from schemas.jobs import JobKind, JobState
from store import changes, leases, nodes
from store.deployments import rules as deployments
from store.deployments.tables import Deployment
from store.errors import Conflict, Missing
from store.liveness import LivenessThresholds
from store.models import EnrollmentToken, Gpu, Job, NodeCredential

# Part of what is hashed: a change to the rule below makes every earlier hash stale.
PLAN_VERSION = "modelforge.decommission.plan.v1"


@dataclass(frozen=True)
class Plan:
    """What a decommission of the node would do, read in one transaction."""

    node_id: uuid.UUID
    credentials: list[uuid.UUID]
    enrollment_tokens: list[uuid.UUID]
    jobs: list[DecommissionJob]
    deployments: list[DecommissionDeployment]


def plan_hash(plan: Plan) -> str:
    """sha256 (hex) over a canonical JSON of the plan: every list sorted by id, keys
    sorted, no whitespace, so the same plan always hashes alike whatever order the
    database returned it in. A job counts with its state and fencing epoch (a claim
    bumps it), a deployment with its state and device; what a decommission does not
    touch (liveness, GPUs, a lease's expiry, progress) is left out, so a heartbeat or a
    progress report does not make a preview stale."""
    canonical = {
        "version": PLAN_VERSION,
        "node_id": str(plan.node_id),
        "credentials": sorted(str(i) for i in plan.credentials),
        "enrollment_tokens": sorted(str(i) for i in plan.enrollment_tokens),
        "jobs": sorted(
            ([str(j.id), j.kind.value, j.state.value, j.lease_epoch] for j in plan.jobs),
            key=lambda entry: entry[0],
        ),
        "deployments": sorted(
            ([str(d.id), d.device_id, d.state.value] for d in plan.deployments),
            key=lambda entry: entry[0],
        ),
    }
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _open_recovery_tokens(node_id: uuid.UUID) -> tuple[ColumnElement[bool], ...]:
    return (
        EnrollmentToken.node_id == node_id,
        EnrollmentToken.used_at.is_(None),
        EnrollmentToken.revoked_at.is_(None),
    )


def _open_jobs(node_id: uuid.UUID) -> Select[Job]:
    return (
        select(Job)
        .where(Job.node_id == node_id, Job.state.not_in(list(leases.FINISHED)))
        .order_by(Job.id)
    )


def _live_deployments(node_id: uuid.UUID) -> Select[Deployment]:
    return (
        select(Deployment)
        .where(Deployment.node_id == node_id, Deployment.state.not_in(list(deployments.ENDED)))
        .order_by(Deployment.id)
    )


@dataclass(frozen=True)
class _Read:
    plan: Plan
    jobs: list[Job]
    deployments: list[Deployment]


async def _read(session: AsyncSession, node_id: uuid.UUID, *, lock: bool) -> _Read:
    """The plan as the database has it now. lock=True (execute, under the node's lock):
    its jobs and deployments locked too, in the lock order every transaction of the node
    follows (the node, its jobs, then its deployments: store/locks.py), so none moves
    between the check and the change; a claim, a report or a drain in flight commits
    first and is seen."""
    jobs_query, deployments_query = _open_jobs(node_id), _live_deployments(node_id)
    if lock:
        jobs_query = jobs_query.with_for_update().execution_options(populate_existing=True)
        deployments_query = deployments_query.with_for_update().execution_options(
            populate_existing=True
        )
    credentials = (
        await session.execute(
            select(NodeCredential.id).where(
                NodeCredential.node_id == node_id, NodeCredential.revoked_at.is_(None)
            )
        )
    ).scalars()
    tokens = (
        await session.execute(select(EnrollmentToken.id).where(*_open_recovery_tokens(node_id)))
    ).scalars()
    jobs = list((await session.execute(jobs_query)).scalars())
    live = list((await session.execute(deployments_query)).scalars())
    plan = Plan(
        node_id=node_id,
        credentials=sorted(credentials),
        enrollment_tokens=sorted(tokens),
        jobs=[
            DecommissionJob(
                id=job.id,
                kind=JobKind(job.kind),
                state=JobState(job.state),
                lease_epoch=job.lease_epoch,
            )
            for job in jobs
        ],
        deployments=[
            DecommissionDeployment(
                id=deployment.id,
                model=deployment.model,
                device_id=deployment.device_id,
                state=DeploymentState(deployment.state),
            )
            for deployment in live
        ],
    )
    return _Read(plan=plan, jobs=jobs, deployments=live)


async def preview(
    session: AsyncSession, thresholds: LivenessThresholds, node_id: uuid.UUID
) -> DecommissionPreview:
    row = await nodes.with_liveness(session, thresholds, node_id)
    if row is None:
        raise Missing(f"node {node_id} does not exist", code=ErrorCode.NOT_FOUND)
    node, liveness = row
    plan = (await _read(session, node_id, lock=False)).plan
    gpus = (
        await session.execute(select(func.count()).select_from(Gpu).where(Gpu.node_id == node_id))
    ).scalar_one()
    return DecommissionPreview(
        node_id=node_id,
        already_decommissioned=node.decommissioned_at is not None,
        credentials_to_revoke=plan.credentials,
        enrollment_tokens_to_revoke=plan.enrollment_tokens,
        jobs_to_cancel=plan.jobs,
        deployments_to_unload=plan.deployments,
        plan_hash=plan_hash(plan),
        gpus=gpus,
        liveness=Liveness(liveness),
    )


async def execute(
    session: AsyncSession, node_id: uuid.UUID, request: DecommissionRequest
) -> DecommissionResult:
    if request.confirm_node_id != node_id:
        raise Conflict(
            "confirm_node_id does not match the node being decommissioned",
            code=ErrorCode.IDENTITY_CONFLICT,
        )
    node = await nodes.lock_existing(session, node_id)
    nodes.require_not_terminal(node)
    read = await _read(session, node.id, lock=True)
    if plan_hash(read.plan) != request.plan_hash:
        # The current hash is not offered: the operator is to look at what changed.
        raise Conflict(
            "the decommission plan changed since it was previewed (a credential, a "
            "recovery token, a job or a deployment of the node); nothing was done: "
            "preview it again",
            code=ErrorCode.DECOMMISSION_PLAN_CHANGED,
        )
    now = await nodes.now(session)
    revoked = await nodes.revoke_active_credentials(session, node.id, "decommissioned", now)
    tokens = list(
        (
            await session.execute(
                update(EnrollmentToken)
                .where(*_open_recovery_tokens(node.id))
                .values(revoked_at=now)
                .returning(EnrollmentToken.id)
            )
        ).scalars()
    )
    for job in read.jobs:
        # A leased one too: its holder's credential is revoked with this commit, so no
        # report of it can come.
        job.cancel_requested_at = job.cancel_requested_at or now
        leases.cancel_now(session, job, now, actor=OPERATOR_ACTOR)
    for deployment in read.deployments:
        deployments.transition(
            session,
            deployment,
            DeploymentState.UNLOADED,
            now,
            reason="node_decommissioned",
            actor=OPERATOR_ACTOR,
        )
    node.decommissioned_at = now
    nodes.standing_changed(session, node.id)
    node.decommission_reason = request.reason
    node.updated_at = now
    changes.record(
        session,
        EventType.NODE_DECOMMISSIONED,
        NodeDecommissioned(
            node_id=node.id,
            reason=request.reason,
            revoked_credential_ids=revoked,
            revoked_enrollment_token_ids=list(tokens),
        ),
        actor=OPERATOR_ACTOR,
    )
    return DecommissionResult(
        node_id=node.id,
        decommissioned_at=now,
        revoked_credential_ids=revoked,
        revoked_enrollment_token_ids=tokens,
        cancelled_job_ids=[job.id for job in read.jobs],
        unloaded_deployment_ids=[deployment.id for deployment in read.deployments],
    )
