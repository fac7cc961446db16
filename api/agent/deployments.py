"""The runtime worker's deployment job routes: deployment.load.v1, health.v1, drain.v1
and unload.v1 over the shared leases (store/leases.py), fenced like every job kind; each
settle also moves the job's deployment (store/deployments/rules.py: on_settled), in the same
transaction."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Response, status

from api.agent import leased
from api.deps import NodeRequest, NodeTransaction
from api.errors import error_responses
from schemas.deployments import (
    KINDS,
    DeploymentClaim,
    DeploymentComplete,
    DrainComplete,
    DrainResult,
    HealthComplete,
    HealthResult,
    LoadClaim,
    LoadComplete,
    LoadResult,
    TargetClaim,
    UnloadComplete,
    UnloadResult,
)
from schemas.errors import ErrorCode
from schemas.events import node_actor
from schemas.jobs import FailAnswer, JobKind, JobState, ProgressAnswer
from schemas.protocol import (
    DEPLOYMENT_JOB_COMPLETE,
    DEPLOYMENT_JOB_FAIL,
    DEPLOYMENT_JOB_PROGRESS,
    DEPLOYMENT_JOBS_NEXT,
)
from schemas.runtime import RuntimeJobFail, RuntimeJobOutcome, RuntimeJobProgress
from store import leases
from store.deployments import rules as deployments
from store.errors import Invalid
from store.models import Job

router = APIRouter(tags=["agent"], responses=error_responses(401, 403, 409, 413, 422, 503))
REPORT = error_responses(404)


@router.get(
    DEPLOYMENT_JOBS_NEXT,
    response_model=DeploymentClaim,
    responses={204: {"description": "nothing to do"}},
)
async def claim_deployment_job(request: NodeTransaction) -> LoadClaim | TargetClaim | Response:
    """The node's next deployment job of any kind, by `kind`."""
    actor = node_actor(request.node.node_id)
    job = await leases.claim(
        request.session,
        kind=KINDS,
        node_id=request.node.node_id,
        policy=request.state.leases,
        actor=actor,
    )
    if job is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    assert job.lease_expires_at is not None
    await deployments.on_claimed(request.session, job, job.updated_at, actor=actor)
    lease = leases.lease_of(job, request.state.leases)
    if job.kind == JobKind.DEPLOYMENT_LOAD:
        return LoadClaim(
            job_id=job.id, attempt=job.attempt, spec=deployments.load_spec_of(job), lease=lease
        )
    return TargetClaim(
        job_id=job.id,
        kind=job.kind,
        attempt=job.attempt,
        spec=deployments.target_spec(job),
        lease=lease,
    )


@router.post(DEPLOYMENT_JOB_PROGRESS, responses=REPORT)
async def report_deployment_progress(
    job_id: uuid.UUID, body: RuntimeJobProgress, request: NodeTransaction
) -> ProgressAnswer:
    """The phase; extends the lease. The answer says whether to stop (cancelled)."""
    job, now = await leased.held(request, KINDS, job_id, body.lease)
    job.progress = {"phase": body.phase, "reported_at": now.isoformat()}
    return leased.extended(request, job, now)


def _result(
    job: Job, report: DeploymentComplete
) -> LoadResult | HealthResult | DrainResult | UnloadResult:
    if report.kind != job.kind:
        raise Invalid(
            f"this is a {job.kind} job; the report is a {report.kind} one",
            code=ErrorCode.VALIDATION_FAILED,
        )
    if isinstance(report, LoadComplete):
        return LoadResult(device_id=report.device_id, health=report.health, load_s=report.load_s)
    if isinstance(report, HealthComplete):
        return HealthResult(health=report.health, in_flight=report.in_flight)
    if isinstance(report, DrainComplete):
        return DrainResult(finished=report.finished, cut=report.cut, settle_s=report.settle_s)
    assert isinstance(report, UnloadComplete)
    return UnloadResult(unloaded=report.unloaded, cut=report.cut, settle_s=report.settle_s)


async def _settled(request: NodeRequest, job: Job) -> None:
    await deployments.on_settled(
        request.session,
        job,
        job.updated_at,
        actor=node_actor(request.node.node_id),
        policy=request.state.settings.reconcile_policy(),
    )


@router.post(DEPLOYMENT_JOB_COMPLETE, responses=REPORT)
async def complete_deployment_job(
    job_id: uuid.UUID, body: DeploymentComplete, request: NodeTransaction
) -> RuntimeJobOutcome:
    """The body must be of the job's kind; it becomes the job's result, and moves the
    deployment (a load makes it ready, a drain or unload unloaded)."""
    job, now = await leased.held(request, KINDS, job_id, body.lease)
    leases.complete(
        request.session, job, now, result=_result(job, body), actor=node_actor(request.node.node_id)
    )
    await _settled(request, job)
    return RuntimeJobOutcome(job_id=job.id, state=JobState(job.state))


@router.post(DEPLOYMENT_JOB_FAIL, responses=REPORT)
async def fail_deployment_job(
    job_id: uuid.UUID, body: RuntimeJobFail, request: NodeTransaction
) -> FailAnswer:
    """A normalised runtime failure: retried with backoff while it may help; a load that
    fails for good makes its deployment `failed` with this code."""
    job, now = await leased.held(request, KINDS, job_id, body.lease)
    answer = leased.failed(
        request, job, now, code=body.code, retryable=body.retryable, detail=body.detail
    )
    await _settled(request, job)
    return answer
