"""The protocol's artifact-job routes (artifact.acquire.v1) over the shared leases
(store/leases.py): claim the next job, then report progress, completion or failure under
the lease. Only the node the job belongs to gets past authentication and ownership, and
only the current, unexpired lease gets past the fence."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Response, status

from api.agent import leased
from api.deps import NodeTransaction
from api.errors import error_responses
from schemas.artifacts import (
    ArtifactClaim,
    CompleteAnswer,
    CompleteReport,
    ProgressReport,
)
from schemas.events import node_actor
from schemas.jobs import (
    FailAnswer,
    FailReport,
    FailureCode,
    JobKind,
    JobState,
    ProgressAnswer,
)
from schemas.protocol import (
    ARTIFACT_JOB_COMPLETE,
    ARTIFACT_JOB_FAIL,
    ARTIFACT_JOB_PROGRESS,
    ARTIFACT_JOBS_NEXT,
)
from store import artifacts, leases

router = APIRouter(tags=["agent"], responses=error_responses(401, 403, 409, 413, 422, 503))
# A report can also name a job that does not exist (404).
REPORT = error_responses(404)


@router.get(
    ARTIFACT_JOBS_NEXT,
    response_model=ArtifactClaim,
    responses={204: {"description": "nothing to do"}},
)
async def claim_artifact_job(request: NodeTransaction) -> ArtifactClaim | Response:
    """At most one of the calling node's queued jobs, leased to it; 204 when none."""
    job = await leases.claim(
        request.session,
        kind=JobKind.ARTIFACT_ACQUIRE,
        node_id=request.node.node_id,
        policy=request.state.leases,
        actor=node_actor(request.node.node_id),
    )
    if job is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return ArtifactClaim(
        job_id=job.id,
        attempt=job.attempt,
        spec=artifacts.spec_of(job),
        lease=leases.lease_of(job, request.state.leases),
    )


@router.post(ARTIFACT_JOB_PROGRESS, responses=REPORT)
async def report_artifact_progress(
    job_id: uuid.UUID, body: ProgressReport, request: NodeTransaction
) -> ProgressAnswer:
    """Bytes per file; extends the lease. The answer says whether to stop (cancelled)."""
    job, now = await leased.held(request, JobKind.ARTIFACT_ACQUIRE, job_id, body.lease)
    artifacts.record_progress(
        request.session, job, body, now, actor=node_actor(request.node.node_id)
    )
    return leased.extended(request, job, now)


@router.post(ARTIFACT_JOB_COMPLETE, responses=REPORT)
async def complete_artifact_job(
    job_id: uuid.UUID, body: CompleteReport, request: NodeTransaction
) -> CompleteAnswer:
    """The verified inventory. A match records the artifact on the node; a mismatch
    fails the job (inventory_mismatch): either way the answer is 200 with the outcome."""
    job, now = await leased.held(request, JobKind.ARTIFACT_ACQUIRE, job_id, body.lease)
    mismatches = await artifacts.complete(
        request.session,
        job,
        body,
        now,
        request.state.leases,
        actor=node_actor(request.node.node_id),
    )
    return CompleteAnswer(job_id=job.id, state=JobState(job.state), mismatches=mismatches)


@router.post(ARTIFACT_JOB_FAIL, responses=REPORT)
async def fail_artifact_job(
    job_id: uuid.UUID, body: FailReport, request: NodeTransaction
) -> FailAnswer:
    """A typed failure. Retried with backoff while it may help and attempts remain."""
    job, now = await leased.held(request, JobKind.ARTIFACT_ACQUIRE, job_id, body.lease)
    return leased.failed(
        request,
        job,
        now,
        code=FailureCode(body.code.value),
        retryable=body.retryable,
        detail=body.detail,
    )
